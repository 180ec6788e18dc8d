from schedsim.cli import main

main()
