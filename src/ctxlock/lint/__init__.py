"""`ctxlock lint`: a chat template checked against the failures templates ship with (arguments it never reads, a
double BOS, history it rewrites, raises ordinary requests reach, a clock read, training masks, portability to other
Jinja engines), each finding with its template line, as text, JSON or SARIF."""
