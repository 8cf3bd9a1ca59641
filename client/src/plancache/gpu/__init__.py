"""The local GPU stack, seen through torch and the cuDNN frontend (the [gpu]
extra): loading it (stack), element types as torch names them, and the
exact target of a local GPU (target). Both sides stand on it: a node detects
its target and executes plans; a worker detects the target it builds for.

Imported lazily: the client installs and fetches plans without torch.

Owns: the GPU stack's loading and the local target's detection.
May import: plancache.errors, plancache.keys, plancache.env.
"""
