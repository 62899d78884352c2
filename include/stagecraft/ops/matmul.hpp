// matmul: batched, broadcasting batch dims, on OpenBLAS.
#pragma once
