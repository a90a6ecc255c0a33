"""Planning a job for a TPU slice on a machine with no TPU: compile its calls there, read memory and time."""
