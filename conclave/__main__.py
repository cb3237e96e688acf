from conclave.cli import exit_now, main

exit_now(main())
