"""`python -m ctxlock`: the `ctxlock` command."""

from ctxlock.cli import main

main()
