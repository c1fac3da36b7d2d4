"""The tutorials' MNIST ConvNet in PyTorch, the model loom builds in nn/convnet.h:
one definition for the PyTorch peers (peers/torch_mnist_ddp.py,
torch_convnet_gpu.py) and the reference fixture (tests/fixtures/make_convnet_fixture.py).
The scripts import it by path (this directory on sys.path)."""
import torch.nn as nn


class ConvNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        # (N, 1, 28, 28) -> (N, 16, 14, 14) -> (N, 32, 7, 7) -> (N, num_classes)
        self.layer1 = nn.Sequential(nn.Conv2d(1, 16, 5, 1, 2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2, 2))
        self.layer2 = nn.Sequential(nn.Conv2d(16, 32, 5, 1, 2), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2, 2))
        self.fc = nn.Linear(7 * 7 * 32, num_classes)

    def forward(self, x):
        out = self.layer2(self.layer1(x))
        return self.fc(out.reshape(out.size(0), -1))
