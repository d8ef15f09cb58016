"""One readable console for N workers, in the launcher: the workers' files followed, lines
printed alike by several ranks printed once with their ranks, a redrawn line (a progress
bar) shown live.

- :mod:`~ddpkit.launch.console.mergedoutput`: the files followed, the merged lines printed.
- :mod:`~ddpkit.launch.console.linemerge`: which lines are one, and when to print them.
- :mod:`~ddpkit.launch.console.liveline`: the line a rank redraws.
"""
