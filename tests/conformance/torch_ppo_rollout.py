"""PPO as in Lightning Fabric's PPO example (CleanRL's shape), on a made-up vectorised
environment, no DataLoader: each update first collects a rollout of 32 steps, each a
no_grad get_action_and_value of the agent left in training mode, then computes the
advantages (a no_grad get_value), then runs 2 epochs of 4 minibatch optimizer steps.
3 updates: 24 optimizer steps, zero evaluations. Each rollout is data collection for
the train step that follows it, the first one included."""
# expect: {"train": 24,
# expect:  "phases": {"train": ["Forward", "Loss", "Backward", "Optimizer"]},
# expect:  "every": {"train": ["Forward", "Backward", "Optimizer"]}}
import torch
import torch.nn as nn
from torch.distributions import Categorical

torch.manual_seed(0)
torch.set_num_threads(1)
NUM_ENVS, NUM_STEPS, UPDATES, EPOCHS, MINIBATCHES = 4, 32, 3, 2, 4


class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 1))
        self.actor = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        dist = Categorical(logits=self.actor(x))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(x)


class Envs:  # NUM_ENVS made-up environments stepped together
    def __init__(self):
        self.state = torch.rand(NUM_ENVS, 4)

    def step(self, action):
        self.state = (self.state + 0.1 * (action[:, None].float() - 0.5) + 0.05 * torch.randn(NUM_ENVS, 4)).clamp(0, 1)
        reward = self.state.mean(1)
        done = reward > 0.8
        self.state[done] = torch.rand(int(done.sum()), 4)
        return self.state.clone(), reward, done.float()


agent, envs = Agent(), Envs()
optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
obs = torch.zeros(NUM_STEPS, NUM_ENVS, 4)
actions, logprobs = torch.zeros(NUM_STEPS, NUM_ENVS), torch.zeros(NUM_STEPS, NUM_ENVS)
rewards, dones, values = (torch.zeros(NUM_STEPS, NUM_ENVS) for _ in range(3))
next_obs, next_done = envs.state.clone(), torch.zeros(NUM_ENVS)
for update in range(UPDATES):
    for step in range(NUM_STEPS):  # the rollout
        obs[step], dones[step] = next_obs, next_done
        with torch.no_grad():
            action, logprob, _, value = agent.get_action_and_value(next_obs)
        values[step], actions[step], logprobs[step] = value.flatten(), action, logprob
        next_obs, rewards[step], next_done = envs.step(action)
    with torch.no_grad():  # generalized advantage estimation
        next_value = agent.get_value(next_obs).reshape(1, -1)
        advantages, last = torch.zeros_like(rewards), 0
        for t in reversed(range(NUM_STEPS)):
            nonterminal = 1.0 - (next_done if t == NUM_STEPS - 1 else dones[t + 1])
            following = next_value if t == NUM_STEPS - 1 else values[t + 1]
            delta = rewards[t] + 0.99 * following * nonterminal - values[t]
            advantages[t] = last = delta + 0.99 * 0.95 * nonterminal * last
        returns = advantages + values
    b_obs, b_actions, b_logprobs = obs.reshape(-1, 4), actions.reshape(-1), logprobs.reshape(-1)
    b_advantages, b_returns = advantages.reshape(-1), returns.reshape(-1)
    size = NUM_STEPS * NUM_ENVS // MINIBATCHES
    for epoch in range(EPOCHS):
        order = torch.randperm(NUM_STEPS * NUM_ENVS)
        for start in range(0, NUM_STEPS * NUM_ENVS, size):
            mb = order[start:start + size]
            _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions[mb].long())
            ratio = (newlogprob - b_logprobs[mb]).exp()
            adv = b_advantages[mb]
            pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean()
            v_loss = 0.5 * ((newvalue.flatten() - b_returns[mb]) ** 2).mean()
            loss = pg_loss - 0.01 * entropy.mean() + 0.5 * v_loss
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
            optimizer.step()
    print(f"update {update} loss {loss.item():.4f}")
torch.save(agent.state_dict(), "agent.pt")
