from fibers.cli import main

raise SystemExit(main())
