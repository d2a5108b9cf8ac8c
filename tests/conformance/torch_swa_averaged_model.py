"""An EMA kept by torch.optim.swa_utils.AveragedModel (a deepcopy inside, updated with
update_parameters after each optimizer step) and a SWALR schedule; the averaged model
is evaluated (2 batches) and saved."""
# expect: {"train": 12, "eval": 2,
# expect:  "phases": {"train": ["GetNext", "Forward", "Loss", "Backward", "Optimizer"], "eval": ["GetNext", "Forward"]},
# expect:  "every": {"train": ["GetNext", "Forward", "Backward", "Optimizer"], "eval": ["Forward"]}, "spans": {"Forward": 14}}
import torch
import torch.nn as nn
from torch.optim.swa_utils import SWALR, AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
swa_lr = SWALR(opt, swa_lr=0.05, anneal_epochs=2)
train = DataLoader(TensorDataset(torch.randn(48, 8), torch.randint(0, 2, (48,))), batch_size=8)
for epoch in range(2):
    for x, y in train:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        ema.update_parameters(model)
    swa_lr.step()
    print(f"epoch {epoch} loss {loss.item():.4f} lr {opt.param_groups[0]['lr']:.4f}")
ema.eval()
with torch.no_grad():
    for x, y in DataLoader(TensorDataset(torch.randn(16, 8), torch.randint(0, 2, (16,))), batch_size=8):
        print("ema predicts", ema(x).argmax(1).tolist())
torch.save(ema.module.state_dict(), "ema.pth")
