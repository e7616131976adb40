from sinklib.claims.registry import main

raise SystemExit(main())
