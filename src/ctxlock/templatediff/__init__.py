"""`ctxlock diff-template`: two chat templates (files, model directories, GGUF files or hub specs) compared by what
they render for the probe corpus, not by their Jinja text: the conversations that differ, the first diverging token of
each, and the capabilities that changed."""
