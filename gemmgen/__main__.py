from gemmgen.cli import main

raise SystemExit(main())
