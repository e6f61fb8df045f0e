"""docs/pytorch.md's training loop as a program, for tests/test_loader.py: killed and resumed.

    python tests/torch_resume_child.py DATASET CHECKPOINT KILL_AT_STEP(-1: never)

Saves the model, the optimizer and the loader's state after every step; with KILL_AT_STEP
it SIGKILLs itself right after that step's save. Prints the final weights' sum of squares
and the steps it ran.
"""

import os
import signal
import sys

import torch

import ingest


def main(dataset: str, checkpoint: str, kill_at: int) -> None:
    torch.manual_seed(0)
    loader = ingest.loader(
        dataset,
        batch_size=100,
        seed=1,
        to="torch",
        features=["id", "x"],
        processes=1,
        options=ingest.ReadOptions(block_window=4),
    )
    model = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = 0
    if os.path.exists(checkpoint):
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])
        step = saved["step"]
    ran = 0
    while loader.state_dict()["pass"] < 2:
        for features, label in loader:
            x = torch.stack([features["id"].float() / 3000, features["x"]], dim=1)
            loss = torch.nn.functional.cross_entropy(model(x), label)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step, ran = step + 1, ran + 1
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict(),
                    "step": step,
                },
                checkpoint,
            )
            if step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
    weights = sum(float((p.detach().double() ** 2).sum()) for p in model.parameters())
    print(repr(weights), step, ran)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
