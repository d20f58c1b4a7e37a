import { graphql } from '../gen';

// A page of a driver's trips from the driver_partner_index, newest first,
// with the ref keys of each trip's latest BASE and STATUS cells.
export const DriverTrips = graphql(`
  query DriverTrips($driver: UUID!, $first: Int = 5, $after: String) {
    trips {
      driverPartnerIndex(
        driverPartnerUuid: $driver
        orderBy: [{ field: TRIP_CREATED_AT, direction: DESC }]
        first: $first
        after: $after
      ) {
        edges {
          node {
            rowKey
            cityUuid
            tripCreatedAt
            row {
              base { refKey }
              status { refKey }
            }
          }
        }
        pageInfo {
          hasNextPage
          endCursor
        }
      }
    }
  }
`);
