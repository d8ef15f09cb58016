"""What watches a run, and never drives it: where a step's time goes (``steptime``), the ranks'
times and the slow one (``ranktimes``, ``rankreport``), rank 0's lines and bar (``console``),
the experiment logs (``explog``) and the trackers they feed (``trackers``, ``wandbfiles``).

The training engine (``ddpkit.train``) tells these parts what happened; they read the world
and the data below them, and nothing here imports the engine."""
