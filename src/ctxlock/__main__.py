from ctxlock.cli import main

main()
