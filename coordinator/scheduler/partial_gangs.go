package scheduler

import "time"

// partialGangs remembers when a cycle first saw each gang (gangID) bound in
// part, until it is whole or gone: a gang bound in part for longer than
// Options.GangBindTimeout is rolled back (checkGangBinds). Used only by the
// cycle goroutine: no lock.
type partialGangs map[string]time.Time

// since is when gang was first seen bound in part; a gang not seen so
// before is from now.
func (g partialGangs) since(gang string, now time.Time) time.Time {
	t, seen := g[gang]
	if !seen {
		t = now
		g[gang] = now
	}
	return t
}

// keep forgets the gangs partial does not hold (whole, or gone).
func (g partialGangs) keep(partial func(gang string) bool) {
	for gang := range g {
		if !partial(gang) {
			delete(g, gang)
		}
	}
}
