"""DQN as in PyTorch's reinforcement-learning tutorial, on a made-up environment:
every iteration the policy network (left in training mode) chooses an action in a
no_grad forward, the environment steps, and from the 8th iteration on one update
learns from a replay batch (a target network, Huber loss, clipped gradients, a
soft update of the target). An iteration with an update is one train step from its
action on; the actions chosen before the first update are no evaluation but the first
update's data: the first train step begins at the first of them. 97 model calls: the
actions', the updates' and the target network's (no_grad, in training mode)."""
# expect: {"train": 33,
# expect:  "phases": {"train": ["Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["Forward", "Backward", "Optimizer"]},
# expect:  "spans": {"Forward": 97}}
import random

import torch
import torch.nn as nn

random.seed(0)
torch.manual_seed(0)
torch.set_num_threads(1)


class QNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x):
        return self.layers(x)


class Env:  # a made-up environment: 4 numbers of state, 2 actions
    def reset(self):
        self.state = torch.rand(4)
        return self.state

    def step(self, action):
        self.state = (self.state + (0.1 if action else -0.1) + 0.05 * torch.randn(4)).clamp(0, 1)
        return self.state, float(self.state.mean()), bool(self.state.mean() > 0.9)


policy, target = QNet(), QNet()
target.load_state_dict(policy.state_dict())
optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3, amsgrad=True)
memory, env = [], Env()
state = env.reset()
updates = 0
for it in range(40):
    if random.random() < 0.2:
        action = random.randrange(2)
    else:
        with torch.no_grad():
            action = int(policy(state[None]).argmax(1))
    next_state, reward, done = env.step(action)
    memory.append((state, action, reward, next_state))
    state = env.reset() if done else next_state
    if len(memory) < 8:
        continue
    batch = random.sample(memory, 8)
    states = torch.stack([b[0] for b in batch])
    actions = torch.tensor([[b[1]] for b in batch])
    rewards = torch.tensor([b[2] for b in batch])
    next_states = torch.stack([b[3] for b in batch])
    q = policy(states).gather(1, actions)
    with torch.no_grad():
        expected = rewards + 0.99 * target(next_states).max(1).values
    loss = nn.SmoothL1Loss()(q, expected.unsqueeze(1))
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_value_(policy.parameters(), 100)
    optimizer.step()
    updates += 1
    target_sd, policy_sd = target.state_dict(), policy.state_dict()
    for k in policy_sd:
        target_sd[k] = policy_sd[k] * 0.005 + target_sd[k] * 0.995
    target.load_state_dict(target_sd)
print("updates", updates, f"loss {loss.item():.4f}")
torch.save(policy.state_dict(), "policy.pt")
