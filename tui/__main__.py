from batchtop.tui.entry import main

main()
