"""Tree layout for a hand-built tree: depths (positions) and one sequence id per root-to-leaf path."""
from localspec.engine.tree import DraftTree


def build_example() -> DraftTree:
    #        0 (root, token 10)
    #       / \
    #      1   2          tokens 11, 12
    #     / \   \
    #    3   4   5        tokens 13, 14, 15
    #    |
    #    6                token 16
    t = DraftTree(capacity=16)
    t.reset(10)
    a = t.add(0, 11, -0.1, 0)
    b = t.add(0, 12, -0.5, 0)
    c = t.add(a, 13, -0.2, 1)
    d = t.add(a, 14, -0.9, 1)
    e = t.add(b, 15, -0.6, 1)
    t.add(c, 16, -0.3, 1)
    assert (a, b, c, d, e) == (1, 2, 3, 4, 5)
    return t


def test_layout_depths_and_sequences():
    t = build_example()
    lay = t.layout()
    assert list(lay.depth) == [0, 1, 1, 2, 2, 2, 3]
    # leaves in index order: 4, 5, 6 -> sequences 0, 1, 2
    assert lay.leaf_seq == {4: 0, 5: 1, 6: 2}
    assert lay.seq_ids == ((0, 1, 2), (0, 2), (1,), (2,), (0,), (1,), (2,))


def test_each_node_attends_exactly_its_ancestors():
    """A node sees node j iff they share a sequence and j is not deeper: exactly its ancestors."""
    t = build_example()
    lay = t.layout()
    for i in range(t.n):
        ancestors, node = set(), i
        while node >= 0:
            ancestors.add(node)
            node = int(t.parent[node])
        visible = {j for j in range(t.n)
                   if set(lay.seq_ids[i]) & set(lay.seq_ids[j]) and lay.depth[j] <= lay.depth[i]}
        # same depth and shared sequence only happens for the node itself
        assert visible == ancestors, (i, visible, ancestors)


def test_paths_and_reset_reuse():
    t = build_example()
    assert t.path_tokens(6) == [11, 13, 16]
    assert t.child_with_token(1, 14) == 4 and t.child_with_token(1, 99) == -1
    assert t.first_leaf_below(1) == 6
    t.reset(42)
    assert t.n == 1 and t.children[0] == [] and t.children[1] == [] and t.tokens[0] == 42
    assert t.layout().seq_ids == ((0,),)
