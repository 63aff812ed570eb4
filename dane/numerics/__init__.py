"""The numerical kernels the methods share: conjugate gradient, the local solvers (and SVRG's compiled loop),
the inner torch optimizer's local solve, the Hessian dissimilarity."""
