from batchtop.tui.cli import main

main()
