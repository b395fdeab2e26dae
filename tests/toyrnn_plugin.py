"""The toy RNN as a plugin: `ssmport --plugin tests/toyrnn_plugin.py ...` registers it."""

import sys
from pathlib import Path

import ssmport

sys.path.insert(0, str(Path(__file__).parent))  # toyrnn.py sits beside this file
from toyrnn import make_toy  # noqa: E402

TOY = ssmport.register_architecture(make_toy())
