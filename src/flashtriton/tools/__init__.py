"""The benchmarking lab, outside the core (which imports nothing from here): the command line (cli.py),
the benchmark suites and their peers (bench.py), the tile sweeps (sweep.py), the roofline and ncu
profiles (roofline.py), and what the compiler made of each kernel (inspect.py). matplotlib and tqdm are
optional extras imported only here."""
