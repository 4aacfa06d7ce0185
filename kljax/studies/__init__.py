"""Studies of where KL-regularized training goes: toy tasks with an exact optimum and training
runs measured against it (`kljax converge-study`)."""
