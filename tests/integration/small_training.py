"""A small PyTorch training loop with gpufleet's profiling hook enabled, as a user would
write it: the hook is the one extra line. Runs on CPU (or a GPU where there is one) until
killed or for --seconds; prints 'ready' once the hook is listening.

    GPUFLEET_WORKFLOW_ID=wf-1 GPUFLEET_PROFILE_DIR=/tmp/p python small_training.py --seconds 60
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # gpufleet's checkout
import producers.profiling.hook

producers.profiling.hook.enable()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--input-delay-s", type=float, default=0.002, help="a slow input pipeline")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    print("ready", flush=True)
    end = time.monotonic() + args.seconds
    step = 0
    while time.monotonic() < end:
        time.sleep(args.input_delay_s)  # waiting on the data loader
        x = torch.randn(64, 256).to(device)
        y = torch.randint(0, 10, (64,)).to(device)
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        step += 1
    print(f"done after {step} steps", flush=True)


if __name__ == "__main__":
    main()
