package geoip

import "strings"

// regionCountries is the country each public cloud region is in (the
// clouds' own region lists), so a Managed proxy's region can be checked
// against where the database places its exit IP.
var regionCountries = map[string]string{
	// Google Cloud.
	"us-central1": "US", "us-east1": "US", "us-east4": "US", "us-east5": "US", "us-south1": "US",
	"us-west1": "US", "us-west2": "US", "us-west3": "US", "us-west4": "US",
	"northamerica-northeast1": "CA", "northamerica-northeast2": "CA", "northamerica-south1": "MX",
	"southamerica-east1": "BR", "southamerica-west1": "CL",
	"europe-west1": "BE", "europe-west2": "GB", "europe-west3": "DE", "europe-west4": "NL",
	"europe-west6": "CH", "europe-west8": "IT", "europe-west9": "FR", "europe-west10": "DE",
	"europe-west12": "IT", "europe-north1": "FI", "europe-north2": "SE", "europe-central2": "PL",
	"europe-southwest1": "ES",
	"asia-east1":        "TW", "asia-east2": "HK", "asia-northeast1": "JP", "asia-northeast2": "JP",
	"asia-northeast3": "KR", "asia-south1": "IN", "asia-south2": "IN", "asia-southeast1": "SG",
	"asia-southeast2": "ID", "australia-southeast1": "AU", "australia-southeast2": "AU",
	"me-west1": "IL", "me-central1": "QA", "me-central2": "SA", "africa-south1": "ZA",
	// AWS.
	"us-east-1": "US", "us-east-2": "US", "us-west-1": "US", "us-west-2": "US",
	"ca-central-1": "CA", "ca-west-1": "CA", "mx-central-1": "MX", "sa-east-1": "BR",
	"eu-west-1": "IE", "eu-west-2": "GB", "eu-west-3": "FR", "eu-central-1": "DE",
	"eu-central-2": "CH", "eu-north-1": "SE", "eu-south-1": "IT", "eu-south-2": "ES",
	"ap-northeast-1": "JP", "ap-northeast-2": "KR", "ap-northeast-3": "JP", "ap-east-1": "HK",
	"ap-southeast-1": "SG", "ap-southeast-2": "AU", "ap-southeast-3": "ID", "ap-southeast-4": "AU",
	"ap-southeast-5": "MY", "ap-south-1": "IN", "ap-south-2": "IN",
	"me-south-1": "BH", "me-central-1": "AE", "il-central-1": "IL", "af-south-1": "ZA",
}

// RegionCountry is the country a cloud region or zone is in ("europe-west1",
// "europe-west1-b", "eu-west-1" and "eu-west-1a" alike); ok false for one
// it does not know.
func RegionCountry(regionOrZone string) (country string, ok bool) {
	name := strings.ToLower(regionOrZone)
	if c, ok := regionCountries[name]; ok {
		return c, true
	}
	// A Google zone: the region, a '-' and a letter.
	if i := strings.LastIndexByte(name, '-'); i > 0 && len(name)-i == 2 {
		if c, ok := regionCountries[name[:i]]; ok {
			return c, true
		}
	}
	// An AWS zone: the region and a letter.
	if n := len(name); n > 1 && name[n-1] >= 'a' && name[n-1] <= 'z' {
		if c, ok := regionCountries[name[:n-1]]; ok {
			return c, true
		}
	}
	return "", false
}
