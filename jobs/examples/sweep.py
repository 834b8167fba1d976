"""A learning-rate sweep from Python with `tfrun.Client`: one job per rate, then each one's last loss.

It runs where the tfrun client is installed, not inside a job: it submits mnist_fit.py (beside it) once per
rate, waits for them all, and reads their metrics from the daemon.

    python jobs/examples/sweep.py --synthetic                  # on this machine's daemon (started if need be)
    python jobs/examples/sweep.py --host box --lr 0.01 0.001   # on a configured host (tfrun hosts list)
"""

import argparse
import os
import sys

import tfrun

HERE = os.path.dirname(os.path.abspath(__file__))


def last_loss(samples):
    """The last validation loss of a job's metrics, else its last training loss (None before any)."""
    for name in ("val_loss", "loss"):
        values = [sample.values[name] for sample in samples if name in sample.values]
        if values:
            return values[-1]
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", help="a configured host or user@host[:port] (default: this machine)")
    parser.add_argument("--lr", type=float, nargs="+", default=[0.01, 0.003, 0.001], help="the rates to try")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--examples", type=int, default=4000)
    parser.add_argument("--synthetic", action="store_true", help="skip the MNIST download")
    parser.add_argument("--python", help="the jobs' interpreter, one with TensorFlow (default: the daemon's)")
    args = parser.parse_args(argv)

    script = os.path.join(HERE, "mnist_fit.py")
    common = ["--epochs", str(args.epochs), "--examples", str(args.examples)]
    common += ["--synthetic"] if args.synthetic else []
    with tfrun.Client(args.host) as client:
        jobs = {}
        for lr in args.lr:
            options = tfrun.JobOptions(name=f"lr-{lr:g}", python=args.python)
            jobs[lr] = client.submit(script, ["--lr", str(lr), *common], options)
        print("submitted jobs " + ", ".join(str(job.id) for job in jobs.values()))
        losses = {}
        for lr, job in jobs.items():
            final = job.wait()
            losses[lr] = last_loss(job.metrics()) if final.state == "succeeded" else None
            shown = "-" if losses[lr] is None else f"{losses[lr]:.4f}"
            print(f"lr {lr:<8g} job {job.id:<5} {final.state:<10} loss {shown}")
    finished = {lr: loss for lr, loss in losses.items() if loss is not None}
    if not finished:
        print("no job finished with a loss: see `tfrun logs JOB`", file=sys.stderr)
        return 1
    best = min(finished, key=finished.get)
    print(f"best: lr {best:g} (loss {finished[best]:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
