"""The oom rule's reading of one line (runner/records/oom.py), over real lines the frameworks print.

Where each line comes from:
- TF 2.21 / TF 2.15: captured here (tensorflow-cpu 2.21 in .venv, 2.15 in .venv-keras2, on an AVX-512 CPU)
  from `tf.zeros([1 << 38])`, with oneDNN on (its default here: the BFC allocator "mklcpu") and with
  TF_ENABLE_ONEDNN_OPTS=0 (the plain "cpu" allocator); tests/test_alerts.py runs that job for real.
- The GPU, TPU, PyTorch and older-TensorFlow lines: copied from public issue threads (tensorflow/tensorflow,
  pytorch/pytorch, pytorch/xla, jax users), named beside each.
"""

from __future__ import annotations

import pytest

from tfrun.runner.records.oom import may_hold_oom, message, oom_kind

TF_2_21_MKLCPU = (
    "W0000 00:00:1796117831.830509    4892 bfc_allocator.cc:502] Allocator (mklcpu) ran out of memory trying to "
    "allocate 1.00TiB (rounded to 1099511627776)requested by op Fill"
)
TF_2_21_OP = (
    "W0000 00:00:1796117932.521328    6593 op_kernel.cc:1858] OP_REQUIRES failed at constant_op.cc:176 : "
    "RESOURCE_EXHAUSTED: OOM when allocating tensor with shape[274877906944] and type float on "
    "/job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu"
)
TF_2_15_MKLCPU = (
    "2026-12-01 09:37:25.800993: W external/local_tsl/tsl/framework/bfc_allocator.cc:485] Allocator (mklcpu) ran "
    "out of memory trying to allocate 1.00TiB (rounded to 1099511627776)requested by op Fill"
)

FATAL = [
    # TensorFlow 2.21, oneDNN on: the allocator gives up, then the op, the rendezvous and the exception say so.
    (TF_2_21_MKLCPU, "TensorFlow"),
    (
        "W0000 00:00:1796117831.830787    4892 op_kernel.cc:1858] OP_REQUIRES failed at constant_op.cc:176 : "
        "RESOURCE_EXHAUSTED: OOM when allocating tensor with shape[274877906944] and type float on "
        "/job:localhost/replica:0/task:0/device:CPU:0 by allocator mklcpu",
        "TensorFlow",
    ),
    (
        "W0000 00:00:1796117831.830814    4892 local_rendezvous.cc:412] Local rendezvous is aborting with status: "
        "RESOURCE_EXHAUSTED: OOM when allocating tensor with shape[274877906944] and type float on "
        "/job:localhost/replica:0/task:0/device:CPU:0 by allocator mklcpu",
        "TensorFlow",
    ),
    (
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: {{function_node "
        "__wrapped__Fill_device_/job:localhost/replica:0/task:0/device:CPU:0}} OOM when allocating tensor with "
        "shape[274877906944] and type float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator mklcpu "
        "[Op:Fill] name: ",
        "TensorFlow",
    ),
    # TensorFlow 2.21, oneDNN off: no allocator line, the op's error comes first.
    (TF_2_21_OP, "TensorFlow"),
    # TensorFlow 2.15, oneDNN on and off.
    (TF_2_15_MKLCPU, "TensorFlow"),
    (
        "2026-12-01 09:38:55.644241: W tensorflow/core/framework/op_kernel.cc:1839] OP_REQUIRES failed at "
        "constant_op.cc:176 : RESOURCE_EXHAUSTED: OOM when allocating tensor with shape[274877906944] and type "
        "float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu",
        "TensorFlow",
    ),
    # TensorFlow on a GPU (tensorflow/tensorflow#60401, TF 2.10; knaw-huc/loghi#55, a current TF).
    (
        "2023-04-23 01:00:16.820335: W tensorflow/core/common_runtime/bfc_allocator.cc:479] Allocator (GPU_0_bfc) "
        "ran out of memory trying to allocate 560.44MiB (rounded to 587661312)requested by op _EagerConst",
        "TensorFlow",
    ),
    (
        "9:07:50.044545: W external/local_xla/xla/tsl/framework/bfc_allocator.cc:501] Allocator (GPU_0_bfc) ran "
        "out of memory trying to allocate 34.10MiB (rounded to 35758080)requested by op StatefulPartitionedCall/"
        "model_new14_1/batch_normalization_36_1/moments/SquaredDifference",
        "TensorFlow",
    ),
    # TensorFlow up to 2.8 wrote the status as "Resource exhausted:" (rishizek/tensorflow-deeplab-v3-plus#19,
    # Azure/MachineLearningNotebooks#880).
    (
        "2018-06-12 09:21:35.590812: W tensorflow/core/framework/op_kernel.cc:1318] OP_REQUIRES failed at "
        "conv_ops.cc:673 : Resource exhausted: OOM when allocating tensor with shape[1,256,2268,1134] and type "
        "float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
        "TensorFlow",
    ),
    (
        "  (0) Resource exhausted: OOM when allocating tensor with shape[16,112,112,147] and type float on "
        "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
        "TensorFlow",
    ),
    # A GPU already full when TensorFlow starts (tensorflow/tensorflow#7983 and the deepracer issue #13).
    (
        "tensorflow.python.framework.errors_impl.InternalError: failed initializing StreamExecutor for CUDA "
        "device ordinal 0: Internal: failed call to cuDevicePrimaryCtxRetain: CUDA_ERROR_OUT_OF_MEMORY: out of "
        "memory; total memory reported: 12790923264",
        "CUDA",
    ),
    # PyTorch: CPU (issue #16's text), Windows (MaximeVandegar/Papers-in-100-Lines-of-Code#10), CUDA
    # (murong-xu/CADS#4, YingqianWang/iPASSR#9, chnsh/DCRNN_PyTorch#6), MPS (pytorch/pytorch#152351).
    (
        "RuntimeError: [enforce fail at alloc_cpu.cpp:127] . DefaultCPUAllocator: can't allocate memory: you tried "
        "to allocate 4398046511104 bytes. Error code 12 (Cannot allocate memory)",
        "PyTorch",
    ),
    (
        "RuntimeError: [enforce fail at C:\\b\\abs_bao0hdcrdh\\croot\\pytorch_1675190257512\\work\\c10\\core\\impl\\"
        "alloc_cpu.cpp:81] data. DefaultCPUAllocator: not enough memory: you tried to allocate 1981808640 bytes.",
        "PyTorch",
    ),
    (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 has a total capacity of "
        "31.47 GiB of which 12.73 GiB is free. Including non-PyTorch memory, this process has 18.73 GiB memory in use.",
        "PyTorch",
    ),
    (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 10.73 GiB (GPU 0; 8.00 GiB total "
        "capacity; 17.20 GiB already allocated; 0 bytes free; 19.15 GiB reserved in total by PyTorch)",
        "PyTorch",
    ),
    (
        "RuntimeError:CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 5.80 GiB total capacity; 4.36 GiB "
        "already allocated; 6.69 MiB free; 4.63 GiB reserved in total by PyTorch)",
        "PyTorch",
    ),
    ("RuntimeError: CUDA error: out of memory", "PyTorch"),  # the CUDA runtime's own error, in many projects' notes
    (
        "RuntimeError: MPS backend out of memory (MPS allocated: 11.14 GB, other allocations: 6.65 GB, max "
        "allowed: 18.13 GB). Tried to allocate 375.40 MB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 "
        "to disable upper limit for memory allocations (may cause system failure).",
        "PyTorch",
    ),
    # PyTorch/XLA on a TPU (pytorch/xla#9524, pytorch/xla#1735).
    (
        "RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of "
        "memory in memory space vmem.",
        "PyTorch",
    ),
    ("RuntimeError: Resource exhausted: From /job:tpu_worker/replica:0/task:0:", "PyTorch"),
    # JAX / XLA (the GPU form; LargeWorldModel/LWM#60 on a TPU; pytorch/xla#3470's XRT log line).
    (
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
        "17179869184 bytes.",
        "JAX/XLA",
    ),
    (
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of "
        "memory in memory space hbm. Used 21.95G of 15.48G hbm.",
        "JAX/XLA",
    ),
    (
        "2022-04-04 00:27:49.642414: E tensorflow/compiler/xla/xla_client/xla_util.cc:88]   OP_REQUIRES failed at "
        "tpu_execute_op.cc:266 : RESOURCE_EXHAUSTED: Attempting to reserve 6.48G at the bottom of memory. That was "
        "not possible. There are 6.78G free, 0B reserved, and 3.33G reservable.",
        "JAX/XLA",
    ),
    # Python and numpy.
    ("MemoryError", "Python"),
    (
        "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 8.00 TiB for an array with shape "
        "(1099511627776,) and data type float64",
        "Python",
    ),
]

QUIET = [
    # The BFC allocator retries with less: both wordings (tensorflow/tensorflow#52123; knaw-huc/loghi#55).
    "2021-06-12 20:18:22.544715: W tensorflow/core/common_runtime/bfc_allocator.cc:271] Allocator (GPU_0_bfc) "
    "ran out of memory trying to allocate 2.54GiB with freed_by_count=0. The caller indicates that this is not a "
    "failure, but may mean that there could be performance gains if more memory were available.",
    "2026-08-17 16:23:20.472136: W external/local_xla/xla/tsl/framework/bfc_allocator.cc:310] Allocator "
    "(GPU_0_bfc) ran out of memory trying to allocate 4.64GiB with freed_by_count=0. The caller indicates that "
    "this is not a failure, but this may mean that there could be performance gains if more memory were available.",
    # The stream executor shrinks its first allocation (tensorflow/tensorflow#60401, #12237).
    "2023-04-23 01:00:06.362905: I tensorflow/stream_executor/cuda/cuda_driver.cc:733] failed to allocate 8.41G "
    "(9029127168 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
    "2017-08-12 08:25:14.841699: E tensorflow/stream_executor/cuda/cuda_driver.cc:924] failed to allocate 90.48M "
    "(94873600 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY",
    # The rest of what TF 2.21 printed around its CPU OOM, and ordinary lines.
    "W0000 00:00:1796117932.521064    6593 cpu_allocator_impl.cc:82] Allocation of 1099511627776 exceeds 10% of "
    "free system memory.",
    "If the cause is memory fragmentation maybe the environment variable 'TF_GPU_ALLOCATOR=cuda_malloc_async' "
    "will improve the situation. ",
    "W0000 00:00:1796117831.830757    4892 bfc_allocator.cc:513] <allocator contains no memory>",
    "I0000 00:00:1796117831.830632    4892 bfc_allocator.cc:1049] BFCAllocator dump for mklcpu",
    "Epoch 3/10 - loss: 0.2345 - memory: 1.2 GB",
    # Quotas, not memory: gRPC's status and an HTTP API's (google-genai).
    "\tstatus = StatusCode.RESOURCE_EXHAUSTED",
    "google.genai.errors.ClientError: 429 RESOURCE_EXHAUSTED. {'error': {'code': 429, 'status': 'RESOURCE_EXHAUSTED'}}",
]


@pytest.mark.parametrize(("line", "kind"), FATAL, ids=[f"{kind}-{i}" for i, (_, kind) in enumerate(FATAL)])
def test_every_fatal_message_is_an_oom_of_its_framework(line: str, kind: str) -> None:
    assert oom_kind(line) == kind


@pytest.mark.parametrize(("line", "kind"), FATAL, ids=[f"{kind}-{i}" for i, (_, kind) in enumerate(FATAL)])
def test_every_fatal_message_passes_the_prefilter(line: str, kind: str) -> None:
    """The watch skips a chunk the prefilter rejects: a pattern without a hint would never fire."""
    assert may_hold_oom(line.encode())


@pytest.mark.parametrize("line", QUIET)
def test_non_fatal_memory_messages_are_not_oom(line: str) -> None:
    assert oom_kind(line) is None


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        (TF_2_21_MKLCPU, "Allocator (mklcpu) ran out of memory trying to allocate 1.00TiB"),
        (TF_2_15_MKLCPU, "Allocator (mklcpu) ran out of memory trying to allocate 1.00TiB"),
        (TF_2_21_OP, "OP_REQUIRES failed at constant_op.cc:176 : RESOURCE_EXHAUSTED: OOM when allocating tensor"),
    ],
    ids=["absl-2.21", "tf-2.15", "absl-op"],
)
def test_the_summary_quotes_the_message_without_its_log_prefix(line: str, shown: str) -> None:
    assert message(line).startswith(shown)
