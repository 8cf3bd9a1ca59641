"""plancache: the command line.

plancache compile SPEC.json --server HOST:PORT [--target T] [--out FILE]
plancache get (--key KEY | SPEC.json) --server HOST:PORT [--target T] [--out FILE]
plancache stats --server HOST:PORT
plancache targets --server HOST:PORT
plancache manifest SPEC.json [SPEC.json ...] --target T [--out MANIFEST]
plancache prefetch MANIFEST --server HOST:PORT [--target T] [--compile-missing]
plancache invalidate (--key KEY | --spec-hash H | --target T) --server HOST:PORT --token ADMIN
plancache explain SPEC.json --server HOST:PORT [--target T]
plancache keygen --out DIR
plancache trust HOST:PORT [--expect FINGERPRINT ...] | --list | --remove KEYID
plancache hash SPEC.json
plancache ops [OP]

The arguments (parser), a node's commands (node), an operator's, which go
through client.admin (admin), a server's signing keys pinned (trust), what the commands naming a plan share
(plan_args), and the entry point that runs them (entry).

Owns: the `plancache` command: its arguments, what each command prints, its exit codes.
May import: plancache.errors, plancache.graphspec, plancache.keys, plancache.run, plancache.transport,
plancache.trust, plancache.gpu, plancache.versions.
"""

from plancache.cli.entry import main

__all__ = ["main"]
