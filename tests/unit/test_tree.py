"""Tree layout for a hand-built tree: depths (positions) and one sequence id per root-to-leaf path."""
import numpy as np

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


def test_copy_depth_first_puts_the_first_child_chain_first_and_keeps_sibling_order():
    tree = DraftTree(16)
    tree.reset(1)
    a = tree.add(0, 10, -0.1, 0, hint=3)
    b = tree.add(0, 20, -0.2, 1)
    a1 = tree.add(a, 11, -0.3, 0)
    b1 = tree.add(b, 21, -0.4, 1)
    tree.add(a, 12, -0.5, 0)
    tree.add(a1, 13, -0.6, 0)
    tree.add(b1, 22, -0.7, 1)
    out = tree.copy_depth_first(DraftTree(16))
    assert out.n == tree.n
    assert list(out.tokens[:out.n]) == [1, 10, 11, 13, 12, 20, 21, 22]
    assert list(out.parent[:out.n]) == [-1, 0, 1, 2, 1, 0, 5, 6]
    assert out.child_tokens(0) == [10, 20] and out.child_tokens(1) == [11, 12]
    assert list(out.depth[:out.n]) == [0, 1, 2, 3, 2, 1, 2, 3]
    assert out.hint[1] == 3 and list(out.drafter[:out.n]) == [-1, 0, 0, 0, 0, 1, 1, 1]
    assert np.allclose(out.logp[:out.n], [0, -0.1, -0.3, -0.6, -0.5, -0.2, -0.4, -0.7])


def test_copy_depth_first_by_score_puts_the_likeliest_path_first_and_keeps_sibling_lists():
    tree = DraftTree(16)
    tree.reset(1)
    a = tree.add(0, 10, 0.0, 0)
    b = tree.add(0, 20, 0.0, 1)
    tree.add(a, 11, 0.0, 0)
    tree.add(b, 21, 0.0, 1)
    tree.add(b, 22, 0.0, 1)
    score = [1.0, 0.2, 0.9, 0.1, 0.3, 0.8]    # b before a; under b, b2 before b1
    out = tree.copy_depth_first(DraftTree(16), score)
    assert list(out.tokens[:out.n]) == [1, 20, 22, 21, 10, 11]
    assert list(out.parent[:out.n]) == [-1, 0, 1, 1, 0, 4]
    assert out.child_tokens(0) == [10, 20] and out.child_tokens(1) == [21, 22]   # siblings' order kept
    layout = out.layout()
    assert all(p < i for i, p in enumerate(out.parent[:out.n]) if i)
    assert len(layout.leaf_seq) == 3
