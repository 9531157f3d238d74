"""`ctxlock probe`: a live server's render and tokenize endpoints (vLLM's, llama.cpp's, ctxlock's own) asked for the
probe corpus and compared with ctxlock's exact render of the model files the user names, to the first diverging
token."""
