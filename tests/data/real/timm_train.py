"""How timm_train.log (and .nan.log, .diverge.log) were made: timm's ImageNet training script, train.py of
huggingface/pytorch-image-models (commit 2aabaef039d918d453b58714ab84562609981112), trimmed to one process on the
CPU. Kept as published: its logging setup (timm.utils.setup_default_logging: a StreamHandler on stderr whose
formatter prints INFO records as the bare message), the INFO lines of main() up to the epoch loop, its
train_one_epoch() (the `Train: {epoch} [{update_idx:>4d}/{updates_per_epoch} (p%)]  Loss: {losses_m.val:#.3g}
({losses_m.avg:#.3g})  Time: ...  LR: {lr:.3e}  Data: ...` line, losses_m a timm.utils.AverageMeter) and
validate() (the `Test: [   i/last]  ...  Loss: ...` lines), timm's own create_model, create_optimizer_v2 (sgd,
nesterov momentum 0.9, weight decay 2e-5), create_scheduler_v2 (cosine, stepped per epoch, warmup), and
LabelSmoothingCrossEntropy(0.1) for training, CrossEntropyLoss for validation. Changes:
- no argparse: `args` is a Namespace of train.py's defaults for what is used, except model test_resnet (a tiny
  ResNet in timm's registry; train.py: resnet50), pretrained=False, num_classes 10, input size 3x32x32,
  batch size 32 (lr therefore 0.1 * 32/256 = 0.0125 by train.py's own rule), 10 epochs (300), warmup 2 epochs (5),
  log_interval 2 (50), no prefetcher, 0 workers, device cpu;
- synthetic data: SyntheticImages below (a fixed random 32x32 template per class plus noise; train.py reads an
  ImageFolder), 512 training images (16 batches an epoch) and 64 validation images, a plain DataLoader instead of
  timm's create_loader (whose transforms need PIL images);
- no checkpoint saver, summary.csv, wandb, EMA, AMP, distributed or mixup branches (so no `*** Best metric` line);
- train_one_epoch() records each printed loss (losses_m.val, i.e. loss.item() of that batch) for the truth sidecar;
- torch.set_num_threads(1);
- CORPUS_INJECT=nan:STEP / diverge:STEP (README.md), STEP the global batch count epoch * 16 + batch_idx, acted on at
  the start of that batch, before its forward pass. nan: one weight of the classifier is set to NaN, so batch STEP's
  loss and every later one is NaN. diverge: the learning rate is multiplied by 1000 in every param_group and in the
  scheduler (base_values, warmup_lr_init, warmup_steps, lr_min), so that the per-epoch scheduler step keeps it x1000;
  batch STEP's own update is the first one made with it, batch STEP + 1 the first loss that feels it. The
  sidecar's inject "print" is the index of the first printed loss the injection reached: for nan the one of batch
  STEP, for diverge the first printed batch after STEP (STEP + 2 here, as every other batch is printed).

Made with Python 3.11.7, torch 2.14.1 (CPU), timm 1.0.31, from /work/main:

    /root/torchvenv/bin/python tests/data/real/timm_train.py > tests/data/real/timm_train.log 2>&1
    CORPUS_INJECT=nan:72 /root/torchvenv/bin/python tests/data/real/timm_train.py \\
        > tests/data/real/timm_train.nan.log 2>&1
    CORPUS_INJECT=diverge:72 /root/torchvenv/bin/python tests/data/real/timm_train.py \\
        > tests/data/real/timm_train.diverge.log 2>&1

The train line prints the batch's loss with 3 significant digits (`#.3g`, hence "rtol" in the sidecar), then the
epoch's running mean in parentheses; only every log_interval-th batch is printed (0, 2, ..., 14: the epoch's last
batch, 15, is not). The printed `[   i/16]` counts batches within the epoch and gives the epoch's length, so the
sidecar's global step is epoch * 16 + i.
"""

import argparse
import json
import logging
import os
import time
from collections import OrderedDict
from contextlib import suppress

import timm
import torch
import torch.nn as nn
from timm import utils
from timm.data import resolve_data_config
from timm.loss import LabelSmoothingCrossEntropy
from timm.models import create_model, safe_model_name
from timm.optim import create_optimizer_v2, optimizer_kwargs
from timm.scheduler import create_scheduler_v2, scheduler_kwargs
from torch.utils.data import DataLoader, Dataset

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "timm_train"
torch.set_num_threads(1)

INJECT = None
if os.environ.get("CORPUS_INJECT"):
    _kind, _step = os.environ["CORPUS_INJECT"].split(":")
    INJECT = {"kind": _kind, "step": int(_step)}
RUN = NAME + ("." + INJECT["kind"] if INJECT else "")
truth = []

_logger = logging.getLogger('train')


class SyntheticImages(Dataset):
    """A learnable stand-in for an ImageFolder: class template plus noise, already normalized."""

    def __init__(self, n, num_classes=10, seed=0):
        g = torch.Generator().manual_seed(1234)
        templates = torch.randn(num_classes, 3, 32, 32, generator=g)
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, num_classes, (n,), generator=g)
        self.x = 0.5 * templates[self.y] + torch.randn(n, 3, 32, 32, generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def inject(global_step, model, optimizer, lr_scheduler):
    """CORPUS_INJECT (not in train.py): acts at the start of the batch whose global count is STEP."""
    if INJECT is None or global_step != INJECT["step"]:
        return
    if INJECT["kind"] == "nan":
        with torch.no_grad():
            model.get_classifier().weight[0, 0] = float("nan")
    elif INJECT["kind"] == "diverge":
        for group in optimizer.param_groups:
            group["lr"] *= 1000
        s = lr_scheduler
        s.base_values = [v * 1000 for v in s.base_values]
        s.warmup_lr_init *= 1000
        s.warmup_steps = [v * 1000 for v in s.warmup_steps]
        s.lr_min *= 1000


def main():
    utils.setup_default_logging()
    # train.py's argparse defaults for what is used here, changed where the docstring says
    args = argparse.Namespace(
        model='test_resnet', pretrained=False, num_classes=10, in_chans=None, input_size=[3, 32, 32],
        img_size=None, crop_pct=None, mean=None, std=None, interpolation='',
        batch_size=32, validation_batch_size=None, channels_last=False, grad_accum_steps=1,
        drop=0.0, drop_path=None, drop_block=None, gp=None, bn_momentum=None, bn_eps=None,
        opt='sgd', opt_eps=None, opt_betas=None, momentum=0.9, weight_decay=2e-5, clip_grad=None, clip_mode='norm',
        layer_decay=None, opt_kwargs={},
        sched='cosine', sched_on_updates=False, lr=None, lr_base=0.1, lr_base_size=256, lr_base_scale='',
        lr_noise=None, lr_noise_pct=0.67, lr_noise_std=1.0, lr_cycle_mul=1.0, lr_cycle_decay=0.5,
        lr_cycle_limit=1, lr_k_decay=1.0, warmup_lr=1e-5, min_lr=0, epochs=10, epoch_repeats=0.,
        start_epoch=None, decay_milestones=[90, 180, 270], decay_epochs=90, warmup_epochs=2, warmup_prefix=False,
        cooldown_epochs=0, patience_epochs=10, decay_rate=0.1,
        smoothing=0.1, seed=42, log_interval=2, workers=0, no_prefetcher=True, eval_metric='top1', tta=0,
        synchronize_step=False, device='cpu',
    )

    args.prefetcher = not args.no_prefetcher
    args.grad_accum_steps = max(1, args.grad_accum_steps)
    device = utils.init_distributed_device(args)
    if args.distributed:
        _logger.info(
            'Training in distributed mode with multiple processes, 1 device per process.'
            f'Process {args.rank}, total {args.world_size}, device {args.device}.')
    else:
        _logger.info(f'Training with a single process on 1 device ({args.device}).')
    assert args.rank >= 0

    utils.random_seed(args.seed, args.rank)

    in_chans = 3
    if args.in_chans is not None:
        in_chans = args.in_chans
    elif args.input_size is not None:
        in_chans = args.input_size[0]

    model = create_model(
        args.model,
        pretrained=args.pretrained,
        in_chans=in_chans,
        num_classes=args.num_classes,
        drop_rate=args.drop,
        drop_path_rate=args.drop_path,
        drop_block_rate=args.drop_block,
        global_pool=args.gp,
        bn_momentum=args.bn_momentum,
        bn_eps=args.bn_eps,
    )

    if utils.is_primary(args):
        _logger.info(
            f'Model {safe_model_name(args.model)} created, param count:{sum([m.numel() for m in model.parameters()])}')

    data_config = resolve_data_config(vars(args), model=model, verbose=utils.is_primary(args))

    model.to(device=device)

    if not args.lr:
        global_batch_size = args.batch_size * args.world_size * args.grad_accum_steps
        batch_ratio = global_batch_size / args.lr_base_size
        if not args.lr_base_scale:
            on = args.opt.lower()
            args.lr_base_scale = 'sqrt' if any([o in on for o in ('ada', 'lamb')]) else 'linear'
        if args.lr_base_scale == 'sqrt':
            batch_ratio = batch_ratio ** 0.5
        args.lr = args.lr_base * batch_ratio
        if utils.is_primary(args):
            _logger.info(
                f'Learning rate ({args.lr}) calculated from base learning rate ({args.lr_base}) '
                f'and effective global batch size ({global_batch_size}) with {args.lr_base_scale} scaling.')

    optimizer = create_optimizer_v2(
        model,
        **optimizer_kwargs(cfg=args),
        **args.opt_kwargs,
    )

    amp_autocast = suppress  # do nothing
    loss_scaler = None
    if utils.is_primary(args):
        _logger.info('AMP not enabled. Training in float32.')

    # synthetic datasets and plain loaders (train.py: create_dataset, create_loader)
    dataset_train = SyntheticImages(512, args.num_classes, seed=1)
    dataset_eval = SyntheticImages(64, args.num_classes, seed=2)
    loader_train = DataLoader(dataset_train, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                              generator=torch.Generator().manual_seed(args.seed))
    loader_eval = DataLoader(dataset_eval, batch_size=args.validation_batch_size or args.batch_size,
                             shuffle=False, num_workers=args.workers)

    train_loss_fn = LabelSmoothingCrossEntropy(smoothing=args.smoothing)
    train_loss_fn = train_loss_fn.to(device=device)
    validate_loss_fn = nn.CrossEntropyLoss().to(device=device)

    # setup learning rate schedule and starting epoch
    updates_per_epoch = (len(loader_train) + args.grad_accum_steps - 1) // args.grad_accum_steps
    lr_scheduler, num_epochs = create_scheduler_v2(
        optimizer,
        **scheduler_kwargs(args),
        updates_per_epoch=updates_per_epoch,
    )
    start_epoch = 0

    if utils.is_primary(args):
        _logger.info(
            f'Scheduled epochs: {num_epochs}. LR stepped per {"epoch" if lr_scheduler.t_in_epochs else "update"}.')

    try:
        for epoch in range(start_epoch, num_epochs):
            train_metrics = train_one_epoch(
                epoch,
                model,
                loader_train,
                optimizer,
                train_loss_fn,
                args,
                device=device,
                lr_scheduler=lr_scheduler,
                amp_autocast=amp_autocast,
                loss_scaler=loss_scaler,
            )

            eval_metrics = validate(
                model,
                loader_eval,
                validate_loss_fn,
                args,
                device=device,
                amp_autocast=amp_autocast,
            )

            if lr_scheduler is not None:
                # step LR for next epoch
                lr_scheduler.step(epoch + 1, eval_metrics[args.eval_metric])

    except KeyboardInterrupt:
        pass

    if INJECT is not None:  # the first print whose loss the injection reached (README.md: "print")
        if INJECT["kind"] == "nan":
            INJECT["print"] = next(i for i, row in enumerate(truth) if row["loss"] != row["loss"])
        else:  # batch STEP's loss is computed before its update, the first one made with the new lr
            INJECT["print"] = next(i for i, row in enumerate(truth) if row["global"] > INJECT["step"])
    with open(os.path.join(HERE, RUN + ".truth.json"), "w") as f:
        json.dump(
            {
                "script": NAME + ".py",
                "source": "huggingface/pytorch-image-models train.py (commit 2aabaef039d918d453b58714ab84562609981112)",
                "framework": f"PyTorch {torch.__version__.split('+')[0]}, timm {timm.__version__}",
                "inject": INJECT,
                "rtol": 5e-3,
                "printed": truth,
            },
            f,
            indent=0,
        )


def train_one_epoch(
        epoch,
        model,
        loader,
        optimizer,
        loss_fn,
        args,
        device=torch.device('cuda'),
        lr_scheduler=None,
        saver=None,
        output_dir=None,
        amp_autocast=suppress,
        loss_scaler=None,
        model_ema=None,
        mixup_fn=None,
):
    second_order = hasattr(optimizer, 'is_second_order') and optimizer.is_second_order
    update_time_m = utils.AverageMeter()
    data_time_m = utils.AverageMeter()
    losses_m = utils.AverageMeter()

    model.train()

    accum_steps = args.grad_accum_steps
    last_accum_steps = len(loader) % accum_steps
    updates_per_epoch = (len(loader) + accum_steps - 1) // accum_steps
    num_updates = epoch * updates_per_epoch
    last_batch_idx = len(loader) - 1
    last_batch_idx_to_accum = len(loader) - last_accum_steps

    data_start_time = update_start_time = time.time()
    optimizer.zero_grad()
    update_sample_count = 0
    for batch_idx, (input, target) in enumerate(loader):
        inject(epoch * len(loader) + batch_idx, model, optimizer, lr_scheduler)  # CORPUS_INJECT, not in train.py
        last_batch = batch_idx == last_batch_idx
        need_update = last_batch or (batch_idx + 1) % accum_steps == 0
        update_idx = batch_idx // accum_steps
        if batch_idx >= last_batch_idx_to_accum:
            accum_steps = last_accum_steps

        if not args.prefetcher:
            input, target = input.to(device), target.to(device)
            if mixup_fn is not None:
                input, target = mixup_fn(input, target)
        if args.channels_last:
            input = input.contiguous(memory_format=torch.channels_last)

        # multiply by accum steps to get equivalent for full update
        data_time_m.update(accum_steps * (time.time() - data_start_time))

        def _forward():
            with amp_autocast():
                output = model(input)
                loss = loss_fn(output, target)
            if accum_steps > 1:
                loss /= accum_steps
            return loss

        def _backward(_loss):
            _loss.backward(create_graph=second_order)
            if need_update:
                if args.clip_grad is not None:
                    utils.dispatch_clip_grad(
                        model.parameters(),
                        value=args.clip_grad,
                        mode=args.clip_mode,
                    )
                optimizer.step()

        loss = _forward()
        _backward(loss)

        if not args.distributed:
            losses_m.update(loss.item() * accum_steps, input.size(0))
        update_sample_count += input.size(0)

        if not need_update:
            data_start_time = time.time()
            continue

        num_updates += 1
        optimizer.zero_grad()

        time_now = time.time()
        update_time_m.update(time.time() - update_start_time)
        update_start_time = time_now

        if update_idx % args.log_interval == 0:
            lrl = [param_group['lr'] for param_group in optimizer.param_groups]
            lr = sum(lrl) / len(lrl)

            if utils.is_primary(args):
                _logger.info(
                    f'Train: {epoch} [{update_idx:>4d}/{updates_per_epoch} '
                    f'({100. * update_idx / (updates_per_epoch - 1):>3.0f}%)]  '
                    f'Loss: {losses_m.val:#.3g} ({losses_m.avg:#.3g})  '
                    f'Time: {update_time_m.val:.3f}s, {update_sample_count / update_time_m.val:>7.2f}/s  '
                    f'({update_time_m.avg:.3f}s, {update_sample_count / update_time_m.avg:>7.2f}/s)  '
                    f'LR: {lr:.3e}  '
                    f'Data: {data_time_m.val:.3f} ({data_time_m.avg:.3f})'
                )
                truth.append({"epoch": epoch, "step": update_idx, "global": epoch * updates_per_epoch + update_idx,
                              "loss": losses_m.val})  # for the sidecar, not in train.py

        if lr_scheduler is not None:
            lr_scheduler.step_update(num_updates=num_updates, metric=losses_m.avg)

        update_sample_count = 0
        data_start_time = time.time()
        # end for

    if hasattr(optimizer, 'sync_lookahead'):
        optimizer.sync_lookahead()

    return OrderedDict([('loss', losses_m.avg)])


def validate(
        model,
        loader,
        loss_fn,
        args,
        device=torch.device('cuda'),
        amp_autocast=suppress,
        log_suffix=''
):
    batch_time_m = utils.AverageMeter()
    losses_m = utils.AverageMeter()
    top1_m = utils.AverageMeter()
    top5_m = utils.AverageMeter()

    model.eval()

    end = time.time()
    last_idx = len(loader) - 1
    with torch.no_grad():
        for batch_idx, (input, target) in enumerate(loader):
            last_batch = batch_idx == last_idx
            if not args.prefetcher:
                input = input.to(device)
                target = target.to(device)
            if args.channels_last:
                input = input.contiguous(memory_format=torch.channels_last)

            with amp_autocast():
                output = model(input)
                if isinstance(output, (tuple, list)):
                    output = output[0]

                # augmentation reduction
                reduce_factor = args.tta
                if reduce_factor > 1:
                    output = output.unfold(0, reduce_factor, reduce_factor).mean(dim=2)
                    target = target[0:target.size(0):reduce_factor]

                loss = loss_fn(output, target)
            acc1, acc5 = utils.accuracy(output, target, topk=(1, 5))

            reduced_loss = loss.data

            losses_m.update(reduced_loss.item(), input.size(0))
            top1_m.update(acc1.item(), output.size(0))
            top5_m.update(acc5.item(), output.size(0))

            batch_time_m.update(time.time() - end)
            end = time.time()
            if utils.is_primary(args) and (last_batch or batch_idx % args.log_interval == 0):
                log_name = 'Test' + log_suffix
                _logger.info(
                    f'{log_name}: [{batch_idx:>4d}/{last_idx}]  '
                    f'Time: {batch_time_m.val:.3f} ({batch_time_m.avg:.3f})  '
                    f'Loss: {losses_m.val:>7.3f} ({losses_m.avg:>6.3f})  '
                    f'Acc@1: {top1_m.val:>7.3f} ({top1_m.avg:>7.3f})  '
                    f'Acc@5: {top5_m.val:>7.3f} ({top5_m.avg:>7.3f})'
                )

    metrics = OrderedDict([('loss', losses_m.avg), ('top1', top1_m.avg), ('top5', top5_m.avg)])

    return metrics


if __name__ == '__main__':
    main()
