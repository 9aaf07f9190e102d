from etn_cli.cli import main

main()
