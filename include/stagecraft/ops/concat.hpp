// concat(xs, axis) and stack(xs, axis).
#pragma once
