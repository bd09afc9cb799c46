"""duplex-actors: serve full-duplex speech-to-speech models of the Moshi family.

Importing the package sets ``NO_TORCH_COMPILE=1`` unless the user set it: moshi reads
that variable when it is *imported* (at decoration time), and on CPU its lazy
torch.compile of RMSNorm costs ~30 s on the first step for no gain.
"""

import os as _os

_os.environ.setdefault("NO_TORCH_COMPILE", "1")

__version__ = "0.1.0"

__all__ = ["__version__"]
