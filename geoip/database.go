package geoip

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	maxminddb "github.com/oschwald/maxminddb-golang/v2"
)

// Location is where a database places an address. A field the databases
// do not know is left empty (zero).
type Location struct {
	// Country is the ISO 3166-1 alpha-2 code, upper case ("BE").
	Country string
	// City is the city's English name.
	City string
	// ASN is the autonomous system the address is announced from, and
	// ASNOrg the organization that holds it.
	ASN    uint32
	ASNOrg string
}

// record is what the City, Country and ASN databases of MaxMind and DB-IP
// store per network; each fills the part it has.
type record struct {
	Country struct {
		ISOCode string `maxminddb:"iso_code"`
	} `maxminddb:"country"`
	City struct {
		Names map[string]string `maxminddb:"names"`
	} `maxminddb:"city"`
	ASN    uint32 `maxminddb:"autonomous_system_number"`
	ASNOrg string `maxminddb:"autonomous_system_organization"`
}

// DefaultRefreshInterval is how often Run looks for changed files: a
// mounted Secret or ConfigMap changes within a minute or so anyway.
const DefaultRefreshInterval = time.Minute

// Database answers lookups from one or more database files (a City and an
// ASN database, say), the later filling what the earlier left empty. Each
// file is held in memory (a GeoLite2-City is about 60 MB), not mapped, so
// a file rewritten in place never changes under a lookup.
type Database struct {
	paths []string

	mu    sync.RWMutex
	files []*file

	// changes has a value when Run reloaded a file since the last receive.
	changes chan struct{}
}

// file is one open database and the state of the file it was read from.
type file struct {
	reader  *maxminddb.Reader
	modTime time.Time
	size    int64
}

// Open opens each database file, or says which one cannot be read: a
// missing or corrupt file is an error at start, not a fleet without geo.
func Open(paths []string) (*Database, error) {
	if len(paths) == 0 {
		return nil, errors.New("no geo database file given")
	}
	d := &Database{paths: paths, files: make([]*file, len(paths)), changes: make(chan struct{}, 1)}
	for i, path := range paths {
		f, err := openFile(path)
		if err != nil {
			return nil, err
		}
		d.files[i] = f
	}
	return d, nil
}

func openFile(path string) (*file, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("the geo database %s: %w", path, err)
	}
	// Read whole rather than mapped: a file rewritten in place (cp over it)
	// would otherwise change under a lookup.
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the geo database %s: %w", path, err)
	}
	reader, err := maxminddb.OpenBytes(data)
	if err != nil {
		return nil, fmt.Errorf("the geo database %s is not a MaxMind-format database: %w", path, err)
	}
	return &file{reader: reader, modTime: info.ModTime(), size: info.Size()}, nil
}

// Lookup says where ip is (ok false: no database knows it, or ip is not
// an address).
func (d *Database) Lookup(ip string) (loc Location, ok bool) {
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return Location{}, false
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	for _, f := range d.files {
		var r record
		result := f.reader.Lookup(addr.Unmap())
		if !result.Found() || result.Decode(&r) != nil {
			continue
		}
		ok = true
		if loc.Country == "" {
			loc.Country = strings.ToUpper(r.Country.ISOCode)
		}
		if loc.City == "" {
			loc.City = r.City.Names["en"]
		}
		if loc.ASN == 0 {
			loc.ASN, loc.ASNOrg = r.ASN, r.ASNOrg
		}
	}
	return loc, ok
}

// Changes delivers a value after a refresh changed what lookups answer.
func (d *Database) Changes() <-chan struct{} { return d.changes }

// Refresh reopens each file whose modification time or size changed, and
// says whether any did. A file that no longer opens keeps its last good
// version, and the error says which.
func (d *Database) Refresh() (changed bool, err error) {
	var errs []error
	for i, path := range d.paths {
		info, statErr := os.Stat(path)
		d.mu.RLock()
		old := d.files[i]
		d.mu.RUnlock()
		if statErr == nil && info.ModTime().Equal(old.modTime) && info.Size() == old.size {
			continue
		}
		f, openErr := openFile(path)
		if openErr != nil {
			errs = append(errs, fmt.Errorf("%w; the last version that opened stays in use", openErr))
			continue
		}
		d.mu.Lock()
		d.files[i] = f
		d.mu.Unlock()
		changed = true
	}
	if changed {
		select {
		case d.changes <- struct{}{}:
		default:
		}
	}
	return changed, errors.Join(errs...)
}

// Run refreshes the files every interval until ctx ends (a manager
// Runnable's Start).
func (d *Database) Run(ctx context.Context, interval time.Duration, log logr.Logger) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			changed, err := d.Refresh()
			if err != nil {
				log.Error(err, "reloading a geo database")
			}
			if changed {
				log.Info("a geo database changed; every proxy's location is looked up again")
			}
		}
	}
}
