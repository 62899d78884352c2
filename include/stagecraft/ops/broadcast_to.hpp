// broadcast_to(x, shape): a materialised broadcast.
#pragma once
