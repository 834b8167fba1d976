"""PyTorch Geometric's GCN example (pyg-team/pytorch_geometric, examples/gcn.py, at commit
5c6461b2305ad068a6d61165b3c55852a11aaa41), run as published with its defaults (Cora's shape, 16 hidden
channels, lr 0.01, 200 epochs, no GDC, no wandb), printing each epoch through torch_geometric.logging's `log()`
as the installed torch_geometric 2.8.1 writes it: `Epoch: 001, Loss: 1.9463, Train: 0.2929, Val: 0.1560,
Test: 0.1540` (ints as %03d, floats as %.4f), then `Median time per epoch: %.4fs`.

Changes:
- synthetic Planetoid-like data (Planetoid downloads Cora): `SyntheticPlanetoid`, an InMemoryDataset with no
  root (as torch_geometric's own FakeDataset) holding one graph of Cora's shape: 2708 nodes in 7 classes of
  about 387, 1433 binary bag-of-words features (18 words a node, 5 of them drawn from its class's own 100
  words, the rest from all 1433), edges from a stochastic block model (torch_geometric.utils.
  stochastic_blockmodel_graph, undirected: 0.008 within a class, 0.0003 between, about 5,300 edges, 80 %
  within a class, as Cora), masks as Planetoid's split="random" draws them (20 training nodes a class, 500
  validation and 1000 test nodes among the rest); the example's `T.NormalizeFeatures()` transform kept;
- torch on 1 thread (torch.set_num_threads(1));
- CORPUS_INJECT=nan:STEP (STEP: optimizer steps since the start, 0-based; one step an epoch, so it acts in
  epoch STEP + 1): before that epoch's train(), conv2's weight (conv2.lin.weight) is set to NaN, so the logits,
  the loss and every gradient are NaN from then on;
- the truth sidecar written beside the log (RUN.truth.json, RUN from the CORPUS_RUN variable), from the values
  the loop gives `log()`.

    cd tests/data/real
    CORPUS_RUN=pyg_gcn PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 /tmp/cv-mixed/bin/python pyg_gcn.py > pyg_gcn.log 2>&1
    CORPUS_RUN=pyg_gcn.nan CORPUS_INJECT=nan:150 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 \\
        /tmp/cv-mixed/bin/python pyg_gcn.py > pyg_gcn.nan.log 2>&1

(/tmp/cv-mixed: torch 2.13.0 (CPU), torch_geometric 2.8.1 installed without its optional extension libraries.)

The line prints only an epoch: every `printed` row has that epoch (1-based, as printed), `step` and `global`
null. Its training loss is `Loss` (`loss`); `Val` and `Test` are evaluations (named `val` and `test`; `Test` is
the test accuracy at the best validation accuracy so far, as the example prints it), listed in `evaluations`;
`Train` (the training nodes' accuracy) is neither.
"""

import argparse
import json
import os
import os.path as osp  # noqa: F401  (the example's import; its data path is not used)
import time

import torch
import torch.nn.functional as F

import torch_geometric
import torch_geometric.transforms as T
from torch_geometric.data import Data, InMemoryDataset
from torch_geometric.logging import init_wandb, log
from torch_geometric.nn import GCNConv
from torch_geometric.utils import stochastic_blockmodel_graph

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.environ.get("CORPUS_RUN", "pyg_gcn")
INJECT = os.environ.get("CORPUS_INJECT")
KIND, INJECT_STEP = (INJECT.split(":")[0], int(INJECT.split(":")[1])) if INJECT else (None, None)
printed = []
evaluations = []
first_after = None  # the index in `printed` of the first loss printed from the injection's step on


class SyntheticPlanetoid(InMemoryDataset):
    """One Cora-shaped graph, made here (Planetoid downloads Cora)."""

    def __init__(self, transform=None, num_nodes=2708, num_features=1433, num_classes=7, seed=0):
        super().__init__(None, transform)
        g = torch.Generator().manual_seed(seed)
        y = torch.randint(0, num_classes, (num_nodes,), generator=g)
        block_sizes = torch.bincount(y, minlength=num_classes)
        probs = torch.full((num_classes, num_classes), 0.0003)
        probs.fill_diagonal_(0.008)
        torch.manual_seed(seed)  # stochastic_blockmodel_graph draws from the global generator
        edge_index = stochastic_blockmodel_graph(block_sizes.tolist(), probs, directed=False)
        # the block model numbers nodes block by block: map block order to the shuffled order
        order = torch.argsort(y, stable=True)
        edge_index = order[edge_index]
        class_words = torch.randperm(num_features, generator=g)[: num_classes * 100].view(num_classes, 100)
        x = torch.zeros(num_nodes, num_features)
        own = class_words[y][torch.arange(num_nodes)[:, None], torch.randint(0, 100, (num_nodes, 5), generator=g)]
        anywhere = torch.randint(0, num_features, (num_nodes, 13), generator=g)
        x[torch.arange(num_nodes)[:, None], torch.cat([own, anywhere], dim=1)] = 1.0
        train_mask = torch.zeros(num_nodes, dtype=torch.bool)  # as Planetoid(split="random")
        for c in range(num_classes):
            idx = (y == c).nonzero(as_tuple=False).view(-1)
            idx = idx[torch.randperm(idx.size(0), generator=g)[:20]]
            train_mask[idx] = True
        remaining = (~train_mask).nonzero(as_tuple=False).view(-1)
        remaining = remaining[torch.randperm(remaining.size(0), generator=g)]
        val_mask = torch.zeros(num_nodes, dtype=torch.bool)
        val_mask[remaining[:500]] = True
        test_mask = torch.zeros(num_nodes, dtype=torch.bool)
        test_mask[remaining[500:1500]] = True
        data = Data(x=x, edge_index=edge_index, y=y, train_mask=train_mask, val_mask=val_mask,
                    test_mask=test_mask)
        self.data, self.slices = self.collate([data])


parser = argparse.ArgumentParser()
parser.add_argument('--dataset', type=str, default='Cora')
parser.add_argument('--hidden_channels', type=int, default=16)
parser.add_argument('--lr', type=float, default=0.01)
parser.add_argument('--epochs', type=int, default=200)
parser.add_argument('--use_gdc', action='store_true', help='Use GDC')
parser.add_argument('--wandb', action='store_true', help='Track experiment')
args = parser.parse_args()

device = torch_geometric.device('auto')

init_wandb(
    name=f'GCN-{args.dataset}',
    lr=args.lr,
    epochs=args.epochs,
    hidden_channels=args.hidden_channels,
    device=device,
)

dataset = SyntheticPlanetoid(transform=T.NormalizeFeatures())  # published: Planetoid(path, args.dataset, ...)
data = dataset[0].to(device)

if args.use_gdc:
    transform = T.GDC(
        self_loop_weight=1,
        normalization_in='sym',
        normalization_out='col',
        diffusion_kwargs=dict(method='ppr', alpha=0.05),
        sparsification_kwargs=dict(method='topk', k=128, dim=0),
        exact=True,
    )
    data = transform(data)


class GCN(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden_channels,
                             normalize=not args.use_gdc)
        self.conv2 = GCNConv(hidden_channels, out_channels,
                             normalize=not args.use_gdc)

    def forward(self, x, edge_index, edge_weight=None):
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, edge_index, edge_weight).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv2(x, edge_index, edge_weight)
        return x


model = GCN(
    in_channels=dataset.num_features,
    hidden_channels=args.hidden_channels,
    out_channels=dataset.num_classes,
).to(device)

optimizer = torch.optim.Adam([
    dict(params=model.conv1.parameters(), weight_decay=5e-4),
    dict(params=model.conv2.parameters(), weight_decay=0)
], lr=args.lr)  # Only perform weight-decay on first convolution.


def train():
    model.train()
    optimizer.zero_grad()
    out = model(data.x, data.edge_index, data.edge_attr)
    loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
    loss.backward()
    optimizer.step()
    return float(loss.detach())


@torch.no_grad()
def test():
    model.eval()
    pred = model(data.x, data.edge_index, data.edge_attr).argmax(dim=-1)

    accs = []
    for mask in [data.train_mask, data.val_mask, data.test_mask]:
        accs.append(int((pred[mask] == data.y[mask]).sum()) / int(mask.sum()))
    return accs


def inject(global_step):
    if KIND == "nan" and global_step == INJECT_STEP:
        with torch.no_grad():
            model.conv2.lin.weight.fill_(float("nan"))


best_val_acc = test_acc = 0
times = []
for epoch in range(1, args.epochs + 1):
    inject(epoch - 1)
    start = time.time()
    loss = train()
    if epoch >= 10:  # We treat the first 10 iterations as a warm-up
        times.append(time.time() - start)

    train_acc, val_acc, tmp_test_acc = test()
    if val_acc > best_val_acc:
        best_val_acc = val_acc
        test_acc = tmp_test_acc
    log(Epoch=epoch, Loss=loss, Train=train_acc, Val=val_acc, Test=test_acc)
    printed.append({"epoch": epoch, "step": None, "global": None, "loss": loss})
    evaluations.append({"name": "val", "epoch": epoch, "step": None, "global": None, "value": val_acc})
    evaluations.append({"name": "test", "epoch": epoch, "step": None, "global": None, "value": test_acc})
    if INJECT and first_after is None and epoch - 1 >= INJECT_STEP:
        first_after = len(printed) - 1
print(f'Median time per epoch: {torch.tensor(times).median():.4f}s')

truth = {
    "script": "pyg_gcn.py",
    "source": "pyg-team/pytorch_geometric examples/gcn.py (5c6461b2305ad068a6d61165b3c55852a11aaa41)",
    "framework": f"PyTorch Geometric {torch_geometric.__version__} / PyTorch {torch.__version__}",
    "inject": {"kind": KIND, "step": INJECT_STEP, "print": first_after} if INJECT else None,
    "tolerance": 5e-05,
    "steps_per_epoch": 1,
    "printed": printed,
    "evaluations": evaluations,
}
with open(os.path.join(HERE, f"{RUN}.truth.json"), "w") as f:
    json.dump(truth, f, indent=1)
    f.write("\n")
