#!/usr/bin/env python3
"""PyTorch's copy of examples/fashion_mnist (issue 9's thread-scaling table): the same MLP
784-256-128-10 (or the CNN), Adam(1e-3), cross-entropy, batch 128, a new shuffle each epoch, on the
CPU with N threads. Prints the example's last line, `test_accuracy=... examples_per_sec=...`, where
examples/s counts the training steps only (as the example does), so the two compare line for line.

  python3 bench/torch_fashion_mnist.py --threads 16 [--model mlp|cnn] [--epochs 1] [--limit N]
"""
import argparse
import gzip
import struct
import time

import numpy as np
import torch


def read_idx(path):
    """An unsigned-byte IDX file (gzip or not) as a numpy array of its shape."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, rank = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(f">{rank}I", data[4:4 + 4 * rank])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def load(directory, name):
    for suffix in (".gz", ""):
        try:
            return read_idx(f"{directory}/{name}{suffix}")
        except FileNotFoundError:
            continue
    raise FileNotFoundError(f"{directory}/{name}(.gz)")


def model_of(kind):
    nn = torch.nn
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                             nn.Linear(128, 10))
    return nn.Sequential(nn.Unflatten(1, (1, 28, 28)), nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--limit", type=int, default=0, help="train on the first N examples only")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    train_x = torch.from_numpy(load(a.data, "train-images-idx3-ubyte").astype(np.float32) / 255.0)
    train_y = torch.from_numpy(load(a.data, "train-labels-idx1-ubyte").astype(np.int64))
    test_x = torch.from_numpy(load(a.data, "t10k-images-idx3-ubyte").astype(np.float32) / 255.0)
    test_y = torch.from_numpy(load(a.data, "t10k-labels-idx1-ubyte").astype(np.int64))
    if a.limit:
        train_x, train_y = train_x[:a.limit], train_y[:a.limit]
    train_x = train_x.reshape(len(train_x), 784)
    test_x = test_x.reshape(len(test_x), 784)

    model = model_of(a.model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    n = len(train_x)
    trained, secs = 0, 0.0
    for epoch in range(a.epochs):
        order = torch.randperm(n)
        t0 = time.perf_counter()
        loss_sum = 0.0
        for i in range(0, n, a.batch):
            idx = order[i:i + a.batch]
            x, y = train_x[idx], train_y[idx]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(idx)
        secs += time.perf_counter() - t0
        trained += n
        with torch.no_grad():
            correct = sum(int((model(test_x[i:i + 1000]).argmax(1) == test_y[i:i + 1000]).sum())
                          for i in range(0, len(test_x), 1000))
        print(f"epoch {epoch + 1} loss={loss_sum / n:.6f} test_accuracy={correct / len(test_x):.4f}", flush=True)
    print(f"test_accuracy={correct / len(test_x):.4f} examples_per_sec={round(trained / secs)} "
          f"(torch {torch.__version__}, {torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
