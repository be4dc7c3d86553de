package placement

// gpufracPolicy is work in progress.
type gpufracPolicy struct{}

func (gpufracPolicy) score(p *Placer, s *Snapshot, i int, q *req) (float64, int) {
	return fgdPolicy{}.score(p, s, i, q)
}
func (gpufracPolicy) cacheable() bool  { return true }
func (gpufracPolicy) usesMemory() bool { return false }
