"""ef.explain: the text that says what a statement, program, sharded run or jit
function computes, how it runs and what it costs (the top floor below the API)."""
