from gemmgen.cli.main import main

raise SystemExit(main())
