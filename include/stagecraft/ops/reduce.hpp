// Reductions over any axes: sum max min argmax argmin (primitives), mean logsumexp (composites).
#pragma once
