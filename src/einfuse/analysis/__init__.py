"""Shape-independent and per-call analysis every later stage reads: the Spec of a
statement (spec_of), dtypes, ranges, the bound call, framework vocabulary, costs and
placeholders (docs/architecture.md)."""
