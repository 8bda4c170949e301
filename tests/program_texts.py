"""Program texts several test modules run: softmax as a program and as one statement,
layernorm (``{n}`` the row length)."""

SOFTMAX = """m[i] := max[j](X[i,j])
e[i,j] := exp(X[i,j] - m[i])
P[i,j] := e[i,j] / sum[k](e[i,k])"""
SOFTMAX_STATEMENT = ("P[i,j] := exp(X[i,j] - max[k](X[i,k])) / "
                     "sum[k](exp(X[i,k] - max[l](X[i,l])))")
LAYERNORM = """mu[i] := sum[j](X[i,j]) / {n}
v[i] := sum[j]((X[i,j] - mu[i])**2) / {n}
y[i,j] := (X[i,j] - mu[i]) / sqrt(v[i] + 0.00001) * g[j] + b[j]"""
