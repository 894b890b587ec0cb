"""Fast exact products for a CPU: matmul layouts, oneDNN-prepacked and packed weight formats, grouped attention.

Each kernel gives the same numbers as the plain torch op up to the order of additions, and times its own
alternatives where that is how it chooses. Imports only the base modules (errors, dtypes, devices).
"""
