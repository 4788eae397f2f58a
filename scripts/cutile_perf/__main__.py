from cutile_perf.cli import main

raise SystemExit(main())
