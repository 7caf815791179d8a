from masklab.cli import main

raise SystemExit(main())
