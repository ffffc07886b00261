"""The laboratory API of pytorch_memlab on memlab's engine: the line
profiler, the tensor report (MemReporter), Courtesy and the IPython
magics."""
