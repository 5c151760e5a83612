"""`gemmgen emit --dispatch`: one standalone CUDA file holding the kernels a set of layers needs,
and one launcher that picks among them by (M, N, K).

model.py predicts a stored kernel's time at any shape from the measurements (the selection
model); select.py decides which kernels the file holds and which token counts of each layer each
serves, from the model's predictions; emit.py writes the file (templates/dispatch.cu.j2), whose
C++ only looks the choice up in the tables select.py made. Callers ask the library
(<launcher>_choice) rather than computing it again.
"""
