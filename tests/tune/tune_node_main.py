"""`gemmgen tune` in a process of its own with the fake GPUs of fakes.py (FakeDevice, fake_compile)
and ``--devices`` over N of them, for test_tune_node.py: python tune_node_main.py N ARGS..."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fakes  # noqa: E402

import gemmgen.measure.device  # noqa: E402
import gemmgen.tune.loop  # noqa: E402
import gemmgen.tune.node  # noqa: E402
from gemmgen.cli.main import main  # noqa: E402

if __name__ == "__main__":
    gemmgen.measure.device.device_count = lambda: int(sys.argv[1])
    gemmgen.tune.loop._compile = fakes.fake_compile
    gemmgen.tune.node.Device = fakes.FakeDevice
    sys.exit(main(sys.argv[2:]))
