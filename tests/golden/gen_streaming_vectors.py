"""Vectors of MosaicML Streaming's sample order for tests/test_streaming_order.c and
tests/test_streaming.c, made by running Streaming's own code with numpy (1.24.2 here, as the shared
vectors). Nothing of Streaming is installed on this machine: point STREAMING_SRC at a checkout of
mosaicml/streaming @ 89e7bb9082457a59f6efcfa4ef910102e07a9729 (v0.14.0.dev0); py1b, removed in 0.11,
is read from STREAMING_PY1B (streaming/base/shuffle/py1b.py of the commit before 93af28ab).
Only numpy-only modules are imported; the functions of stream.py, dataset.py and
batching/random.py that the epoch order needs are taken from their source text (ast) and run
unchanged against a stub dataset.

Run: STREAMING_SRC=... STREAMING_PY1B=... /usr/bin/python3 tests/golden/gen_streaming_vectors.py
Writes tests/golden/streaming_order_vectors.json."""
import ast
import importlib.util
import json
import os
import sys
import types

import numpy as np

SRC = os.environ.get('STREAMING_SRC')
PY1B = os.environ.get('STREAMING_PY1B')
if not SRC or not PY1B:
    print(__doc__)
    raise SystemExit(3)  # make_golden.py's NEEDS_SOURCE: reported as not run, the others go on
BASE = os.path.join(SRC, 'streaming', 'base')

# Stub packages so that submodules import without running streaming/__init__.py (torch, clouds...).
for name, path in [('streaming', os.path.join(SRC, 'streaming')), ('streaming.base', BASE),
                   ('streaming.base.shuffle', os.path.join(BASE, 'shuffle')),
                   ('streaming.base.partition', os.path.join(BASE, 'partition'))]:
    m = types.ModuleType(name)
    m.__path__ = [path]
    sys.modules[name] = m


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


shuffle_mod = load('streaming.base.shuffle', os.path.join(BASE, 'shuffle', '__init__.py'))
partition_mod = load('streaming.base.partition', os.path.join(BASE, 'partition', '__init__.py'))
sampling_mod = load('streaming.base.sampling', os.path.join(BASE, 'sampling.py'))
py1b_mod = load('streaming.base.shuffle.py1b', PY1B)


def get_shuffle(algo, *args):
    if algo == 'py1b':
        return py1b_mod.get_shuffle_py1b(*args)
    return shuffle_mod.get_shuffle(algo, *args)


def extract(path, cls, fn):
    """The source of cls.fn (or a module-level fn when cls is None) as a standalone function."""
    tree = ast.parse(open(path).read())
    body = tree.body
    if cls:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == fn)
    node.decorator_list = []
    node.returns = None  # annotations name types this script does not import
    for a in node.args.args + node.args.kwonlyargs:
        a.annotation = None
    return ast.unparse(node)


ns = {'np': np, 'Optional': object, 'NDArray': object, 'Sequence': object, 'Self': object, 'Any': object,
      'get_sampling': sampling_mod.get_sampling, 'get_partitions': partition_mod.get_partitions,
      'get_shuffle': get_shuffle}
for path, cls, fn in [(os.path.join(BASE, 'stream.py'), 'Stream', 'validate_weights'),
                      (os.path.join(BASE, 'stream.py'), 'Stream', 'apply_weights'),
                      (os.path.join(BASE, 'dataset.py'), 'StreamingDataset', 'resample_streams'),
                      (os.path.join(BASE, 'batching', 'random.py'), None, 'generate_work_random_batching')]:
    exec(extract(path, cls, fn).replace('StreamingDataset', 'object').replace('World', 'object'), ns)


class StreamStub:
    validate_weights = classmethod(ns['validate_weights'])
    apply_weights = classmethod(ns['apply_weights'])

    def __init__(self, **weights):
        for k, v in weights.items():
            setattr(self, k, v)


class DatasetStub:
    resample_streams = ns['resample_streams']


def epoch_work(streams, shard_sizes, epoch, sample_in_epoch, nodes, ranks, workers, batch, **kw):
    """What StreamingDataset(...) computes for an epoch: generate_work_random_batching."""
    d = DatasetStub()
    d.streams = [StreamStub(**s) for s in streams]
    d.num_streams = len(streams)
    d.shards_per_stream = np.array([len(s) for s in shard_sizes], np.int64)
    d.shard_offset_per_stream = np.concatenate([[0], np.cumsum(d.shards_per_stream)[:-1]]).astype(np.int64)
    d.samples_per_shard = np.array([x for s in shard_sizes for x in s], np.int64)
    d.sample_offset_per_shard = d.samples_per_shard.cumsum() - d.samples_per_shard
    samples_per_stream = np.array([sum(s) for s in shard_sizes], np.int64)
    d.sampling_method = kw.get('sampling_method', 'balanced')
    d.sampling_granularity = kw.get('sampling_granularity', 1)
    d.shuffle = kw.get('shuffle', True)
    d.shuffle_algo = kw.get('shuffle_algo', 'py1e')
    d.shuffle_seed = kw.get('shuffle_seed', 9176)
    d.epoch_seed_change = d.shuffle and d.sampling_method == 'balanced'
    d.epoch_size = StreamStub.apply_weights(d.streams, samples_per_stream, kw.get('epoch_size'), d.shuffle_seed)
    d.num_canonical_nodes = kw.get('num_canonical_nodes', nodes)
    d.shuffle_block_size = kw.get('shuffle_block_size', max(4_000_000 // d.num_canonical_nodes, 1 << 18))
    d.partition_algo = kw.get('partition_algo', 'relaxed')
    d.initial_physical_nodes = kw.get('initial_physical_nodes')
    d.batch_size = batch
    world = types.SimpleNamespace(num_nodes=nodes, ranks_per_node=ranks, workers_per_rank=workers)
    ids = ns['generate_work_random_batching'](d, world, epoch, sample_in_epoch)
    return {'streams': streams, 'shard_sizes': shard_sizes, 'epoch': epoch, 'sample_in_epoch': sample_in_epoch,
            'nodes': nodes, 'ranks_per_node': ranks, 'workers_per_rank': workers, 'batch_size': batch,
            'options': kw, 'epoch_size': int(d.epoch_size),
            'choose_per_stream': [int(s.choose) for s in d.streams], 'shape': list(ids.shape),
            'ids': ids.flatten().tolist()}


def main():
    out = {'generated_with': {'numpy': np.__version__, 'streaming_commit': '89e7bb9082457a59f6efcfa4ef910102e07a9729'}}
    # numpy draws used by the order
    out['integers'] = []
    for seed, lo, hi in [(0, 0, 10), (9176, 196608, 327680), (5, 0, 1 << 40), (7, -5, 3), (11, 0, 1)]:
        g = np.random.default_rng(seed)
        out['integers'].append({'seed': seed, 'low': lo, 'high': hi,
                                'values': [int(g.integers(lo, hi)) for _ in range(50)]})
    out['uniform'] = []
    for seed, lo, hi in [(3, -2.5, 7.25), (9176, -0.0, 0.0), (4, 0, 1e6)]:
        g = np.random.default_rng(seed)
        out['uniform'].append({'seed': seed, 'low': lo, 'high': hi, 'values': g.uniform(lo, hi, 20).tolist()})
    out['choice'] = []
    for seed, n, k in [(1, 10, 3), (2, 100, 99), (3, 20000, 50), (4, 20000, 5000), (5, 7, 7), (6, 3, 0)]:
        g = np.random.default_rng(seed)
        vals = g.choice(n, k, False).tolist()
        out['choice'].append({'seed': seed, 'n': n, 'values': vals, 'next': str(int(g.bit_generator.random_raw()))})
    # shuffles not in the shared vectors: py1b, larger py1e/py1br, seeds past 2^32
    out['shuffle'] = []
    for algo, sizes, ncn, seed, epoch, bs in [
            ('py1b', [10, 10, 10, 10, 7], 2, 9176, 0, 16), ('py1b', [50] * 6, 3, 17, 3, 40),
            ('py1e', [100, 37, 250, 64, 1, 90], 4, 9176, 2, 64), ('py1e', [30] * 20, 1, 123456789012, 1, 100),
            ('py1br', [100, 37, 250, 64, 1, 90], 4, 9176, 2, 64), ('py1s', [30] * 20, 3, 5, 0, 7),
            ('py2s', [100, 37, 250, 64, 1, 90], 4, 42, 5, 1), ('naive', [1000], 1, 2 ** 40, 3, 1)]:
        ids = get_shuffle(algo, np.array(sizes, np.int64), ncn, seed, epoch, bs)
        out['shuffle'].append({'algo': algo, 'shard_sizes': sizes, 'num_canonical_nodes': ncn, 'seed': seed,
                               'epoch': epoch, 'block_size': bs, 'ids': ids.tolist()})
    # partitions: resumption (drop_first), padding cases, relaxed with another initial node count
    out['partition'] = []
    for algo, args in [('orig', (37, 4, 2, 2, 2, 3, 12, None)), ('orig', (100, 2, 4, 3, 1, 5, 0, None)),
                       ('orig', (101, 8, 2, 3, 2, 4, 40, None)), ('orig', (5, 8, 1, 4, 1, 2, 0, None)),
                       ('orig', (50, 1, 1, 3, 1, 4, 24, None)), ('relaxed', (96, 4, 3, 2, 1, 4, 48, 4)),
                       ('relaxed', (200, 6, 4, 2, 2, 3, 0, 6)), ('relaxed', (60, 1, 1, 4, 1, 2, 0, 1))]:
        ids = partition_mod.get_partitions(algo, *args)
        keys = ['num_samples', 'num_canonical_nodes', 'num_physical_nodes', 'ranks_per_node', 'workers_per_rank',
                'batch_size', 'drop_first', 'initial_physical_nodes']
        case = {'algo': algo, **dict(zip(keys, args)), 'shape': list(ids.shape), 'ids': ids.flatten().tolist()}
        out['partition'].append(case)
    # whole epochs of a StreamingDataset (resample_streams + partition + shuffle + mapping)
    out['epochs'] = [
        epoch_work([{}], [[40, 40, 17]], 0, 0, 1, 1, 1, 4),
        epoch_work([{}], [[40, 40, 17]], 1, 0, 1, 3, 1, 4, shuffle_algo='py1s', num_canonical_nodes=2),
        epoch_work([{}], [[40, 40, 17]], 2, 24, 1, 2, 1, 4, shuffle_block_size=30),
        epoch_work([{}], [[40, 40, 17]], 0, 0, 1, 2, 1, 5, shuffle=False),
        epoch_work([{'proportion': 0.7}, {'proportion': 0.3}], [[20, 13], [50, 50, 9]], 0, 0, 1, 2, 1, 4,
                   epoch_size=150, shuffle_block_size=50),
        epoch_work([{'repeat': 2.5}, {'choose': 40}, {}], [[10, 7], [30, 30], [15]], 3, 0, 1, 4, 1, 2,
                   shuffle_algo='py1br', shuffle_block_size=20),
        epoch_work([{'repeat': 0.5}, {}], [[10, 7], [30, 30]], 1, 16, 1, 4, 1, 2, sampling_method='fixed',
                   sampling_granularity=3, shuffle_algo='py1e', shuffle_block_size=16),
        epoch_work([{}], [[31, 32, 33, 34]], 0, 0, 2, 2, 1, 3, num_canonical_nodes=4),
        epoch_work([{}], [[31, 32, 33, 34]], 0, 36, 3, 2, 1, 2, num_canonical_nodes=4, initial_physical_nodes=2),
    ]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'streaming_order_vectors.json')
    with open(path, 'w') as f:
        json.dump(out, f, separators=(',', ':'))
        f.write('\n')
    print('wrote', path)


main()
