from etn_cli.cli.app import main

main()
