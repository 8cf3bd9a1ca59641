"""`python -m plancache.cli`: the `plancache` command without its installed script."""

from plancache.cli.entry import main

raise SystemExit(main())
