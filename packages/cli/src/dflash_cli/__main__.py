from dflash_cli import main

raise SystemExit(main())
