import pytest
import torch

from masking import Views, corrupt, draws_of_rows, make_views, view_shape

T = 140  # divisible by every view count below (2, 4, 5, 7)


@pytest.mark.parametrize("m,cms", [(1 / 7, False), (0.2, False), (0.5, False), (0.75, False),
                                   (0.5, True), (0.75, True), (0.8, True), (6 / 7, True)])
def test_views_shapes_and_ratio(m, cms):
    B = 3
    V, K, M = view_shape(T, m, cms)
    views = make_views(B, T, m, cms, generator=torch.Generator().manual_seed(0))
    assert views.rows.tolist() == [b for b in range(B) for _ in range(V)]
    assert views.visible_pos.shape == (B * V, K) and views.target_pos.shape == (B * V, M)
    if not cms:
        assert V == 1 and M == round(m * T)
    else:
        assert M / T == pytest.approx(m) and V == {0.5: 2, 0.75: 4, 0.8: 5, 6 / 7: 7}[m]
    # within a view, the visible and target positions are disjoint and together cover every position once
    both = torch.cat([views.visible_pos, views.target_pos], dim=1).sort(dim=1).values
    assert torch.equal(both, torch.arange(T).expand(B * V, T))


@pytest.mark.parametrize("m", [0.5, 0.75, 0.8, 6 / 7])
def test_cms_views_partition_positions(m):
    B = 4
    V, _, _ = view_shape(T, m, True)
    views = make_views(B, T, m, True, generator=torch.Generator().manual_seed(1))
    # the visible sets of a row's views partition its positions
    per_row = views.visible_pos.view(B, T).sort(dim=1).values
    assert torch.equal(per_row, torch.arange(T).expand(B, T))
    # so each position is predicted by every view but the one that sees it
    predicted = torch.zeros(B, T, dtype=torch.long)
    predicted.scatter_add_(1, views.target_pos.view(B, -1), torch.ones(B, views.target_pos.numel() // B, dtype=torch.long))
    assert (predicted == V - 1).all()


def test_views_reproducible_from_generator():
    a = make_views(4, T, 0.5, True, generator=torch.Generator().manual_seed(7))
    b = make_views(4, T, 0.5, True, generator=torch.Generator().manual_seed(7))
    c = make_views(4, T, 0.5, True, generator=torch.Generator().manual_seed(8))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a.visible_pos, c.visible_pos)


def test_views_are_random_per_row():
    views = make_views(64, T, 0.5, False, generator=torch.Generator().manual_seed(0))
    # each position is masked in about half the rows
    counts = torch.zeros(T).index_add_(0, views.target_pos.flatten(), torch.ones(views.target_pos.numel()))
    assert counts.min() > 10 and counts.max() < 54


def test_bad_ratio_and_block_size_are_clear_errors():
    with pytest.raises(ValueError, match="mask_ratio"):
        view_shape(128, 1.0, False)
    with pytest.raises(ValueError, match="block_size must be a multiple of 4"):
        view_shape(130, 0.75, True)
    for m in (0.2, 1 / 3, 0.4, 0.6, 0.7):  # CMS cannot realise these: an error, not the nearest ratio
        with pytest.raises(ValueError, match=f"mask_ratio={m} is not one of them"):
            view_shape(120, m, True)
    assert view_shape(120, 2 / 3, True) == (3, 40, 80) and view_shape(120, 0.667, True) == (3, 40, 80)


def test_corrupt_masks_target_positions_only():
    idx = torch.randint(0, 100, (2, 20))
    views = make_views(2, 20, 0.25, False, generator=torch.Generator().manual_seed(0))
    out = corrupt(idx, views.target_pos, mask_id=999)
    assert (out.gather(1, views.target_pos) == 999).all()
    assert torch.equal(out.gather(1, views.visible_pos), idx.gather(1, views.visible_pos))


def test_corrupt_80_10_10():
    idx = torch.full((1, 100_000), 5)
    target_pos = torch.arange(100_000)[None]
    g = torch.Generator().manual_seed(0)
    u, noise = torch.rand(target_pos.shape, generator=g), torch.randint(0, 50257, target_pos.shape, generator=g)
    out = corrupt(idx, target_pos, mask_id=50257, u=u, noise=noise)
    masked, kept = (out == 50257).float().mean().item(), (out == 5).float().mean().item()
    assert abs(masked - 0.8) < 0.01 and 0.09 < kept < 0.11  # 10% kept (+ random draws of 5, rare)
    assert (out < 50258).all()


@pytest.mark.parametrize("m,cms", [(0.5, True), (0.75, True), (0.2, False)])
def test_draws_of_rows_are_those_rows_views_renumbered(m, cms):
    # a trainer draws for a whole batch and cuts each micro-step's rows: rows 2..4 of 6, with a per-view tensor beside
    # the views (as ELECTRA's uniforms)
    V, _, M = view_shape(T, m, cms)
    views = make_views(6, T, m, cms, generator=torch.Generator().manual_seed(0))
    u = torch.rand(6 * V, M)
    cut, cut_u = draws_of_rows((views, u), slice(2, 5), V)
    assert isinstance(cut, Views) and cut.rows.tolist() == [b for b in range(3) for _ in range(V)]
    mine = views.rows.ge(2) & views.rows.lt(5)  # the views made from input rows 2, 3 and 4
    assert torch.equal(cut.visible_pos, views.visible_pos[mine]) and torch.equal(cut.target_pos, views.target_pos[mine])
    assert torch.equal(cut_u, u[mine])


def test_views_move_like_tensors():
    views = make_views(2, T, 0.5, True).to(torch.int32)
    assert isinstance(views, Views) and all(t.dtype == torch.int32 for t in views)
