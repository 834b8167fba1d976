"""TensorFlow's tutorial "Custom training: walkthrough" (tensorflow/docs,
site/en/tutorials/customization/custom_training_walkthrough.ipynb, the Iris version, commit
023b91c89dc06b3c6462d8426cc655acd452282e), its code cells in order, prints as published:
`Step: {}, Initial Loss: {}` and `Step: {},         Loss: {}` (one optimization step before the loop), then
`Epoch {:03d}: Loss: {:.3f}, Accuracy: {:.3%}` in the loop (the epoch's mean loss, a tf.keras.metrics.Mean),
then `Test set accuracy: {:.3%}` and the three predictions.

Changes:
- synthetic Iris-shaped data (the tutorial downloads iris_training.csv and iris_test.csv): two CSV files of the
  same layout (a header line, 4 measurements and a label 0-2), 120 and 30 rows drawn around each species' mean
  measurements, written to a temporary folder and read with tf.data.experimental.make_csv_dataset as published;
- a print every 2 epochs (the tutorial: every 50), of its 201 epochs: 101 epoch lines;
- no plots (matplotlib), and the notebook's bare expressions (`predictions[:5]`, `tf.nn.softmax(...)`,
  `tf.stack(...)`) not printed, as a script does not print them;
- TensorFlow on 1 thread (intra- and inter-op);
- CORPUS_INJECT=nan:STEP or diverge:STEP (STEP: the optimizer's step, `optimizer.iterations`, which is 1 when
  the loop starts: the tutorial takes one step before it; 4 batches an epoch): before the update of step STEP,
  the kernel of the last Dense (the logits) is set to NaN (nan), or the learning rate multiplied by 1000 (diverge);
- the truth sidecar written beside the log (RUN.truth.json, RUN from the CORPUS_RUN variable).

    cd tests/data/real
    CORPUS_RUN=tf_walkthrough ../../../.venv/bin/python tf_walkthrough.py > tf_walkthrough.log 2>&1
    CORPUS_RUN=tf_walkthrough.nan CORPUS_INJECT=nan:323 ../../../.venv/bin/python tf_walkthrough.py \\
        > tf_walkthrough.nan.log 2>&1
    CORPUS_RUN=tf_walkthrough.diverge CORPUS_INJECT=diverge:323 ../../../.venv/bin/python tf_walkthrough.py \\
        > tf_walkthrough.diverge.log 2>&1

STEP 323 is epoch 80's third batch: 40 epoch lines (epochs 0-78) before it. The truth lists the two `Step:`
lines (step and global: the optimizer's step as printed) and the epoch lines (epoch as printed, step and
global null: the line prints no step). `inject.print` is the index in `printed` of the first epoch line whose
epoch the injection acted in.
"""

import json
import os
import tempfile

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.environ.get("CORPUS_RUN", "tf_walkthrough")
INJECT = os.environ.get("CORPUS_INJECT")
KIND, INJECT_STEP = (INJECT.split(":")[0], int(INJECT.split(":")[1])) if INJECT else (None, None)
EVERY = 2
tf.keras.utils.set_random_seed(0)
printed = []


def synthetic_iris(path, rows, rng):
    """A CSV laid out as iris_training.csv: `rows,4,setosa,versicolor,virginica`, then 4 floats and a label."""
    means = np.array([[5.0, 3.4, 1.5, 0.2], [5.9, 2.8, 4.3, 1.3], [6.6, 3.0, 5.6, 2.0]])
    spread = np.array([[0.35, 0.38, 0.17, 0.1], [0.5, 0.31, 0.47, 0.2], [0.64, 0.32, 0.55, 0.27]])
    labels = rng.integers(0, 3, rows)
    values = np.round(np.abs(means[labels] + spread[labels] * rng.standard_normal((rows, 4))), 1)
    with open(path, "w") as f:
        f.write(f"{rows},4,setosa,versicolor,virginica\n")
        for row, label in zip(values, labels):
            f.write(",".join(f"{v:.1f}" for v in row) + f",{label}\n")
    return path


data_dir = tempfile.mkdtemp()
rng = np.random.default_rng(0)
train_dataset_fp = synthetic_iris(os.path.join(data_dir, "iris_training.csv"), 120, rng)

print("TensorFlow version: {}".format(tf.__version__))  # noqa: UP032
print("Eager execution: {}".format(tf.executing_eagerly()))  # noqa: UP032
print("Local copy of the dataset file: {}".format(train_dataset_fp))  # noqa: UP032

# column order in CSV file
column_names = ["sepal_length", "sepal_width", "petal_length", "petal_width", "species"]

feature_names = column_names[:-1]
label_name = column_names[-1]

print("Features: {}".format(feature_names))  # noqa: UP032
print("Label: {}".format(label_name))  # noqa: UP032

class_names = ["Iris setosa", "Iris versicolor", "Iris virginica"]

batch_size = 32

train_dataset = tf.data.experimental.make_csv_dataset(
    train_dataset_fp, batch_size, column_names=column_names, label_name=label_name, num_epochs=1
)

features, labels = next(iter(train_dataset))

print(features)


def pack_features_vector(features, labels):
    """Pack the features into a single array."""
    features = tf.stack(list(features.values()), axis=1)
    return features, labels


train_dataset = train_dataset.map(pack_features_vector)

features, labels = next(iter(train_dataset))

print(features[:5])

model = tf.keras.Sequential(
    [
        tf.keras.layers.Dense(10, activation=tf.nn.relu, input_shape=(4,)),  # input shape required
        tf.keras.layers.Dense(10, activation=tf.nn.relu),
        tf.keras.layers.Dense(3),
    ]
)

predictions = model(features)

print("Prediction: {}".format(tf.argmax(predictions, axis=1)))  # noqa: UP032
print("    Labels: {}".format(labels))  # noqa: UP032

loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def loss(model, x, y, training):
    # training=training is needed only if there are layers with different
    # behavior during training versus inference (e.g. Dropout).
    y_ = model(x, training=training)

    return loss_object(y_true=y, y_pred=y_)


l = loss(model, features, labels, training=False)  # noqa: E741
print("Loss test: {}".format(l))  # noqa: UP032


def grad(model, inputs, targets):
    with tf.GradientTape() as tape:
        loss_value = loss(model, inputs, targets, training=True)
    return loss_value, tape.gradient(loss_value, model.trainable_variables)


optimizer = tf.keras.optimizers.SGD(learning_rate=0.01)

loss_value, grads = grad(model, features, labels)

print("Step: {}, Initial Loss: {}".format(optimizer.iterations.numpy(), loss_value.numpy()))  # noqa: UP032
printed.append({"epoch": None, "step": 0, "global": 0, "loss": float(loss_value.numpy())})

optimizer.apply_gradients(zip(grads, model.trainable_variables))

after = loss(model, features, labels, training=True).numpy()
print("Step: {},         Loss: {}".format(optimizer.iterations.numpy(), after))  # noqa: UP032
printed.append({"epoch": None, "step": 1, "global": 1, "loss": float(after)})


injected = []  # the index in `printed` of the first loss printed once the injection acted


def inject():
    if INJECT_STEP is None or int(optimizer.iterations.numpy()) != INJECT_STEP:
        return
    injected.append(None)
    if KIND == "nan":
        kernel = model.layers[-1].kernel  # the logits layer: NaN logits, a NaN loss
        kernel.assign(np.full(kernel.shape, np.nan, dtype="float32"))
    elif KIND == "diverge":
        optimizer.learning_rate.assign(optimizer.learning_rate * 1000)


## Note: Rerunning this cell uses the same model variables

# Keep results for plotting
train_loss_results = []
train_accuracy_results = []

num_epochs = 201

for epoch in range(num_epochs):
    epoch_loss_avg = tf.keras.metrics.Mean()
    epoch_accuracy = tf.keras.metrics.SparseCategoricalAccuracy()

    # Training loop - using batches of 32
    for x, y in train_dataset:
        inject()
        # Optimize the model
        loss_value, grads = grad(model, x, y)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

        # Track progress
        epoch_loss_avg.update_state(loss_value)  # Add current batch loss
        # Compare predicted label to actual label
        # training=True is needed only if there are layers with different
        # behavior during training versus inference (e.g. Dropout).
        epoch_accuracy.update_state(y, model(x, training=True))

    # End epoch
    train_loss_results.append(epoch_loss_avg.result())
    train_accuracy_results.append(epoch_accuracy.result())

    if epoch % EVERY == 0:
        print(
            "Epoch {:03d}: Loss: {:.3f}, Accuracy: {:.3%}".format(  # noqa: UP032
                epoch, epoch_loss_avg.result(), epoch_accuracy.result()
            )
        )
        printed.append({"epoch": epoch, "step": None, "global": None, "loss": float(epoch_loss_avg.result())})
        if injected and injected[0] is None:
            injected[0] = len(printed) - 1

test_fp = synthetic_iris(os.path.join(data_dir, "iris_test.csv"), 30, rng)

test_dataset = tf.data.experimental.make_csv_dataset(
    test_fp, batch_size, column_names=column_names, label_name="species", num_epochs=1, shuffle=False
)

test_dataset = test_dataset.map(pack_features_vector)

test_accuracy = tf.keras.metrics.Accuracy()

for x, y in test_dataset:
    # training=False is needed only if there are layers with different
    # behavior during training versus inference (e.g. Dropout).
    logits = model(x, training=False)
    prediction = tf.argmax(logits, axis=1, output_type=tf.int32)
    test_accuracy(prediction, y)

print("Test set accuracy: {:.3%}".format(test_accuracy.result()))  # noqa: UP032

predict_dataset = tf.convert_to_tensor(
    [
        [5.1, 3.3, 1.7, 0.5],
        [5.9, 3.0, 4.2, 1.5],
        [6.9, 3.1, 5.4, 2.1],
    ]
)

# training=False is needed only if there are layers with different
# behavior during training versus inference (e.g. Dropout).
predictions = model(predict_dataset, training=False)

for i, logits in enumerate(predictions):
    class_idx = tf.argmax(logits).numpy()
    p = tf.nn.softmax(logits)[class_idx]
    name = class_names[class_idx]
    print("Example {} prediction: {} ({:4.1f}%)".format(i, name, 100 * p))  # noqa: UP032

truth = {
    "script": "tf_walkthrough.py",
    "source": "tensorflow/docs site/en/tutorials/customization/custom_training_walkthrough.ipynb (Iris)",
    "framework": f"TensorFlow {tf.__version__} (Keras {tf.keras.__version__})",
    "inject": {"kind": KIND, "step": INJECT_STEP, "print": injected[0]} if INJECT else None,
    "tolerance": 5e-04,
    "printed": printed,
}
with open(os.path.join(HERE, f"{RUN}.truth.json"), "w") as f:
    json.dump(truth, f, indent=1)
    f.write("\n")
